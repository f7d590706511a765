"""The train-short-test-long laboratory. Uses the core; the core never imports it.

``posenc compare`` trains small byte-level GPTs that differ only in their positional encoding and
measures how each extrapolates past its training length. docs/lab.md describes the commands, what
they write and which module holds what; docs/lab-results.md has the measured results.
"""
