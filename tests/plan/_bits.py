"""What the plan tests compare with: equal bits, and seeded inputs."""
import numpy as np

import mgtrace as mt


def same_bits(a, b):
    """Equal as bytes (NaN payloads and -0.0 included), same dtype and shape."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def rand(*shape, seed=0):
    """A float32 tensor of standard normal values from ``seed``."""
    return mt.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))
