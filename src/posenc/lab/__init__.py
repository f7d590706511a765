"""The train-short-test-long laboratory. Uses the core; the core never imports it."""
