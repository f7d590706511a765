"""Test settings shared by the whole suite.

Hypothesis runs derandomised so that a run is reproducible (CI must be deterministic); the examples
still vary across strategies and tests.
"""

import os

import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "posenc",
    derandomize=True,
    deadline=None,
    max_examples=int(os.environ.get("POSENC_HYPOTHESIS_EXAMPLES", "40")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("posenc")

torch.set_num_threads(1)  # tests run two at a time under pytest-xdist on a 2-core machine
