# cython: language_level=3
"""Devices: where a tensor's memory lives and which kernels run on it.

``Device("cpu")`` is ``cpu:0``. ``cpu:1``, ``cpu:2``... are logical CPU
devices: host memory like ``cpu:0``, but distinct for placement, so that the
rule "all tensor operands of an op are on one device" can be exercised
without a GPU. ``cuda:N`` (alias ``gpuN``) needs the optional CUDA build;
``xpux`` means ``cuda:0`` when that build and a GPU are present, else ``cpu:0``
(MegEngine's spelling).
"""
import re

DEVICES = []             # by id; a Device's id is its position here
cdef dict _by_key = {}   # (type, index) -> Device
default_device_id = 0

_SPEC = re.compile(r"^(cpu|cuda|gpu|xpu)(?::?(\d+|x))?$")


def cuda_available():
    """True when the CUDA extension was built and sees at least one GPU."""
    try:
        from mgtrace._core import _cuda
    except ImportError:
        return False
    return _cuda.device_count() > 0


cdef class Device:
    """A device: ``Device("cpu")``, ``Device("cpu:1")``, ``Device("cuda:0")``.

    Raises:
        ValueError: the spec is not a device name.
        TypeError: the spec is not a str or Device.
    """

    def __cinit__(self, spec="cpu"):
        pass

    def __init__(self, spec="cpu"):
        cdef Device d = device_of(spec)
        self.type = d.type
        self.index = d.index
        self._id = d._id

    def __repr__(self):
        return f"Device('{self.type}:{self.index}')"

    def __str__(self):
        return f"{self.type}:{self.index}"

    def __eq__(self, other):
        if isinstance(other, str):
            try:
                other = device_of(other)
            except (ValueError, TypeError):
                return False
        if not isinstance(other, Device):
            return NotImplemented
        return self.type == (<Device>other).type and self.index == (<Device>other).index

    def __hash__(self):
        return hash((self.type, self.index))

    def __reduce__(self):
        return (Device, (str(self),))


cdef Device _make(str typ, int index):
    key = (typ, index)
    d = _by_key.get(key)
    if d is None:
        d = Device.__new__(Device)
        (<Device>d).type = typ
        (<Device>d).index = index
        (<Device>d)._id = len(DEVICES)
        DEVICES.append(d)
        _by_key[key] = d
    return d


cdef Device device_of(object spec):
    if isinstance(spec, Device):
        return spec
    if spec is None:
        return DEVICES[default_device_id]
    if not isinstance(spec, str):
        raise TypeError(f"device must be a str or Device, not {type(spec).__name__}")
    m = _SPEC.match(spec.strip().lower())
    if m is None:
        raise ValueError(f"unknown device {spec!r}; expected 'cpu', 'cpu:N', 'cuda:N', 'gpuN' or 'xpux'")
    kind, idx = m.group(1), m.group(2)
    if kind == "xpu":
        if idx not in (None, "x"):
            raise ValueError(f"unknown device {spec!r}; 'xpux' picks CUDA when present, else CPU")
        return _make("cuda", 0) if cuda_available() else _make("cpu", 0)
    if idx == "x":
        raise ValueError(f"unknown device {spec!r}")
    index = int(idx) if idx is not None else 0
    if index > 1023:
        raise ValueError(f"device index {index} out of range in {spec!r}")
    return _make("cuda" if kind in ("cuda", "gpu") else "cpu", index)


cdef int device_id(object spec) except -1:
    return device_of(spec)._id


_make("cpu", 0)


def set_default_device(device):
    """Set the device for tensors created without one and ops with no tensor operand.

    Args:
        device: a Device or a spec such as ``"cpu"``, ``"cpu:1"``, ``"cuda:0"``.
    """
    global default_device_id
    default_device_id = device_id(device)


def get_default_device():
    """The device used when none is given (``cpu:0`` unless changed)."""
    return DEVICES[default_device_id]


def as_device(spec):
    """Normalise a spec (str or Device; None = default) to a Device."""
    return device_of(spec)
