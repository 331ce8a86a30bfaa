"""Random tensors, reproducible across runs and platforms.

Bits come from NumPy's Philox-4x64 counter-based bit generator,
``np.random.Philox(key=seed)``: its 64-bit output stream is fixed by the
key alone (the same on every platform and NumPy version). The transforms
from bits to values are written here, on top of that raw stream, rather
than taken from ``np.random.Generator`` (whose algorithms NumPy may change
between feature releases):

- ``uniform``: 53 random bits -> u in [0, 1) (float64), ``low + (high - low) * u``,
  rounded to float32 (and kept below ``high``).
- ``normal``: Box-Muller on pairs of such uniforms, in float64, rounded
  to float32.
- ``randint``: rejection sampling of 64-bit words (unbiased), int32 result.
- ``permutation``: an argsort of one 64-bit key per position (stable sort).

Every draw consumes the stream in a documented, size-determined way, so
``mgtrace.random.seed(42)`` makes every later draw reproducible, whatever
ran before. The module-level functions use one global :class:`RNG`
(thread-safe: draws are serialized); make your own ``RNG(seed)`` for an
independent stream. Unseeded, the global generator starts from OS entropy.

>>> import mgtrace.random as R
>>> R.seed(42)
>>> a = R.normal(size=(3,))
>>> R.seed(42)
>>> bool((R.normal(size=(3,)).numpy() == a.numpy()).all())
True
"""
import math as _math
import threading as _threading

import numpy as _np

from mgtrace._core import Tensor as _Tensor, tensor as _tensor
from mgtrace._core import args as _A
from mgtrace._core import trace_hooks as _hooks

__all__ = ["RNG", "seed", "get_rng", "normal", "uniform", "randint", "permutation"]

_INV_2_53 = 1.0 / (1 << 53)
_TWO_PI = 2.0 * _math.pi
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


def _size(fn, size):
    """None -> () (a 0-d result); an int or a sequence of ints >= 0 -> a tuple."""
    if size is None:
        return ()
    return _A.check_numel(fn, "size", _A.to_shape(fn, "size", size, negative=False))


class RNG:
    """A random generator over Philox-4x64 (``np.random.Philox(key=seed)``).

    Args:
        seed: int in [0, 2**128), used as the Philox key (counter from 0);
            None takes a key from OS entropy.

    Raises:
        TypeError: a seed that is not an int. ValueError: a negative seed
            or one of 2**128 or more.

    >>> g = RNG(7)
    >>> g.randint(10, size=(4,)).tolist() == RNG(7).randint(10, size=(4,)).tolist()
    True
    """

    def __init__(self, seed=None):
        self._lock = _threading.Lock()
        self.seed(seed)

    def seed(self, seed=None):
        """Restart the stream from key ``seed`` (None: OS entropy)."""
        if seed is None:
            key = int(_np.random.SeedSequence().generate_state(1, _np.uint64)[0])
        else:
            key = _A.to_int("seed", "seed", seed)
            if not 0 <= key < (1 << 128):
                raise ValueError(f"seed: seed must be in [0, 2**128), got {key}")
        with self._lock:
            self._seed = key
            self._bits = _np.random.Philox(key=key)

    @property
    def initial_seed(self):
        """The key the stream started from."""
        return self._seed

    def get_state(self):
        """Where the stream stands (an opaque value for :meth:`set_state`)."""
        with self._lock:
            return self._seed, self._bits.state

    def set_state(self, state):
        """Continue the stream from a value :meth:`get_state` returned (so
        the draws after it repeat).

        >>> g = RNG(3); s = g.get_state(); a = g.uniform(size=2).tolist()
        >>> g.set_state(s); g.uniform(size=2).tolist() == a
        True
        """
        seed, bits = state
        with self._lock:
            self._seed = seed
            self._bits.state = bits

    # ---- raw stream
    def _raw(self, n):
        """n 64-bit words (uint64 array) from the stream."""
        hook = _hooks.current()
        if hook is not None:        # a plan recording refuses draws (they would be frozen)
            hook.on_random(self)
        return _np.asarray(self._bits.random_raw(n), dtype=_np.uint64).reshape(-1)

    def _unit(self, n):
        """n float64 in [0, 1): the top 53 bits of one word each."""
        return (self._raw(n) >> _np.uint64(11)).astype(_np.float64) * _INV_2_53

    # ---- draws
    def uniform(self, low=0.0, high=1.0, size=None, device=None):
        """float32 values uniform in [low, high).

        Args:
            low, high: finite numbers, low <= high.
            size: None (a 0-d tensor), an int or a tuple of ints.
            device: where the result lives (default device when None).

        Raises:
            ValueError: low > high, non-finite bounds, negative sizes.
            TypeError: non-numeric bounds or sizes.

        >>> RNG(0).uniform(2.0, 3.0, size=(2,)).dtype
        dtype('float32')
        """
        fn = "uniform"
        low = _A.to_float(fn, "low", low, finite=True)
        high = _A.to_float(fn, "high", high, finite=True)
        if low > high:
            raise ValueError(f"{fn}: low={low} must not exceed high={high}")
        shape = _size(fn, size)
        n = int(_np.prod(shape, dtype=_np.int64))
        with self._lock:
            u = self._unit(n)
        v = (low + (high - low) * u).astype(_np.float32)
        if high > low:   # rounding to float32 may reach high; keep the interval half-open
            top = _np.nextafter(_np.float32(high), _np.float32(-_np.inf))
            _np.minimum(v, top, out=v)
        return _tensor(v.reshape(shape), dtype="float32", device=device)

    def normal(self, mean=0.0, std=1.0, size=None, device=None):
        """float32 values from N(mean, std**2) (Box-Muller on Philox uniforms).

        Args:
            mean: finite number. std: finite number >= 0.
            size, device: as :meth:`uniform`.

        Raises:
            ValueError: std < 0, non-finite arguments, negative sizes.

        >>> RNG(0).normal(size=(2, 3)).shape
        (2, 3)
        """
        fn = "normal"
        mean = _A.to_float(fn, "mean", mean, finite=True)
        std = _A.to_float(fn, "std", std, finite=True)
        if std < 0:
            raise ValueError(f"{fn}: std must be >= 0, got {std}")
        shape = _size(fn, size)
        n = int(_np.prod(shape, dtype=_np.int64))
        m = (n + 1) // 2
        with self._lock:
            u = self._unit(2 * m)
        u1 = 1.0 - u[0::2]                 # (0, 1]: log is finite
        u2 = u[1::2]
        r = _np.sqrt(-2.0 * _np.log(u1))
        z = _np.empty(2 * m, _np.float64)
        z[0::2] = r * _np.cos(_TWO_PI * u2)
        z[1::2] = r * _np.sin(_TWO_PI * u2)
        v = (mean + std * z[:n]).astype(_np.float32)
        return _tensor(v.reshape(shape), dtype="float32", device=device)

    def randint(self, low, high=None, size=None, device=None):
        """int32 values uniform in [low, high), or [0, low) when high is None
        (NumPy's ``randint`` convention).

        Args:
            low, high: ints within int32, low < high.
            size, device: as :meth:`uniform`.

        Raises:
            ValueError: an empty range, bounds outside int32, negative sizes.
            TypeError: non-int bounds.

        >>> v = RNG(1).randint(3, 6, size=100).numpy()
        >>> bool(v.min() >= 3 and v.max() < 6), v.dtype.name
        (True, 'int32')
        """
        fn = "randint"
        low = _A.to_int(fn, "low", low)
        if high is None:
            low, high = 0, low
        else:
            high = _A.to_int(fn, "high", high)
        if low >= high:
            raise ValueError(f"{fn}: the range [low={low}, high={high}) is empty")
        if low < _INT32_MIN or high - 1 > _INT32_MAX:
            raise ValueError(f"{fn}: [low={low}, high={high}) must lie within int32")
        shape = _size(fn, size)
        n = int(_np.prod(shape, dtype=_np.int64))
        span = high - low
        limit = (1 << 64) - ((1 << 64) % span)   # accept words below limit: unbiased
        out = _np.empty(n, _np.int64)
        filled = 0
        with self._lock:
            while filled < n:
                need = n - filled
                words = self._raw(need)
                ok = words[words < _np.uint64(limit)] if limit < (1 << 64) else words
                take = ok[:need]
                out[filled:filled + take.size] = (take % _np.uint64(span)).astype(_np.int64)
                filled += take.size
        return _tensor((out + low).astype(_np.int32).reshape(shape), dtype="int32", device=device)

    def permutation(self, n, device=None):
        """A random permutation: of range(n) (int32) when n is an int, or of
        the first axis of a Tensor (a shuffled copy, its dtype), as
        MegEngine's ``permutation``.

        Raises:
            ValueError: n < 0 or beyond int32. TypeError: n neither int nor Tensor.

        >>> sorted(RNG(3).permutation(5).tolist())
        [0, 1, 2, 3, 4]
        """
        fn = "permutation"
        if isinstance(n, _Tensor):
            if n.ndim == 0:
                raise ValueError(f"{fn}: n must be an int or a tensor with at least 1 axis")
            idx = self.permutation(n.shape[0])
            return n[idx.to(n.device)]
        k = _A.to_int(fn, "n", n)
        if not 0 <= k <= _INT32_MAX:
            raise ValueError(f"{fn}: n must be in [0, 2**31), got {k}")
        with self._lock:
            keys = self._raw(k)
        perm = _np.argsort(keys, kind="stable").astype(_np.int32)
        return _tensor(perm, dtype="int32", device=device)


_global = RNG()


def get_rng():
    """The global :class:`RNG` that the module-level functions draw from."""
    return _global


def seed(n):
    """Reseed the global generator: every later draw of the module-level
    functions (and of ``F.dropout``) is then reproducible.

    Args:
        n: int in [0, 2**128), the Philox key.

    Raises:
        TypeError: n not an int. ValueError: n out of range.

    >>> import mgtrace.random as R
    >>> R.seed(0); a = R.uniform(size=2).tolist()
    >>> R.seed(0); a == R.uniform(size=2).tolist()
    True
    """
    if n is None:
        raise TypeError("seed: n must be an int, not None")
    _global.seed(n)


def normal(mean=0.0, std=1.0, size=None, device=None):
    """float32 samples of N(mean, std**2) from the global generator; see
    :meth:`RNG.normal`.

    >>> import mgtrace.random as R
    >>> R.normal(size=(2,)).dtype
    dtype('float32')
    """
    return _global.normal(mean, std, size, device)


def uniform(low=0.0, high=1.0, size=None, device=None):
    """float32 samples uniform in [low, high) from the global generator; see
    :meth:`RNG.uniform`.

    >>> import mgtrace.random as R
    >>> R.uniform(size=3).shape
    (3,)
    """
    return _global.uniform(low, high, size, device)


def randint(low, high=None, size=None, device=None):
    """int32 samples in [low, high) (or [0, low)) from the global generator;
    see :meth:`RNG.randint`.

    >>> import mgtrace.random as R
    >>> R.randint(1, size=2).tolist()
    [0, 0]
    """
    return _global.randint(low, high, size, device)


def permutation(n, device=None):
    """A random permutation from the global generator; see :meth:`RNG.permutation`.

    >>> import mgtrace.random as R
    >>> R.permutation(3).shape
    (3,)
    """
    return _global.permutation(n, device)
