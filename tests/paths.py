"""Pin which RoPE kernels a test runs: the compiled CPU op (posenc.kernels.native) or posenc's torch ones."""

import contextlib
import os


@contextlib.contextmanager
def torch_kernels():
    """Inside: the compiled CPU op is off (POSENC_DISABLE_NATIVE=1), so the torch paths run."""
    saved = os.environ.get("POSENC_DISABLE_NATIVE")
    os.environ["POSENC_DISABLE_NATIVE"] = "1"
    try:
        yield
    finally:
        if saved is None:
            del os.environ["POSENC_DISABLE_NATIVE"]
        else:
            os.environ["POSENC_DISABLE_NATIVE"] = saved
