"""What ``posenc bench`` runs, on the CPU or a CUDA device.

* :mod:`.rope`: RoPE throughput against the copy floor and transformers;
* :mod:`.attention`: long-context ALiBi attention, time and peak memory;
* :mod:`.biases`: every score bias at long context, forward and forward + backward;
* :mod:`.serving`: RoPE at decode and short-prefill shapes;
* :mod:`.presets`: the sizes per device; :mod:`.targets`: what a full CPU run is checked against;
* :mod:`.timing`, :mod:`.memory`, :mod:`.report`: timing, peak memory and tables, shared by both.

Timings on a shared machine are noisy, so every comparison is made side by side in one process: the
cases of one row run round-robin, repeated, and the median is reported.
"""
