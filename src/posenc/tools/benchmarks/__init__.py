"""What ``posenc bench`` runs: RoPE throughput (:mod:`.rope`) and long-context ALiBi attention (:mod:`.attention`).

Timings on a shared CPU are noisy, so every comparison is made side by side in one process: the cases
of one row are run round-robin, repeated, and the median is reported. Peak memory is measured in a fresh
subprocess per case (the rise of ``ru_maxrss`` over the inputs), because the CPU allocator gives no
per-call peak of its own.
"""
