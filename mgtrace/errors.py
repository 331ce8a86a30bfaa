"""mgtrace's exception root, the exceptions not tied to one layer, and the
one "unknown name, did you mean" helper.

Every mgtrace exception class subclasses :class:`Error` and the matching
builtin (STYLE.md item 6), so callers may catch ``mgtrace.Error`` (anything
mgtrace raised on purpose), ``mgtrace.ArchiveError``, or plain ``ValueError``.
"""
import difflib

__all__ = ["Error", "ArchiveError", "RegistryError", "VersionError", "DeviceError",
           "DeviceUnavailable", "NoKernelError", "AutodiffError", "did_you_mean"]


class Error(Exception):
    """The root of every exception class mgtrace defines (each also
    subclasses a builtin: ArchiveError is a ValueError, TraceError a
    RuntimeError, ...)."""


def did_you_mean(name, known):
    """``" Did you mean 'a', 'b'?"`` naming up to three of ``known`` close to
    ``name``, or ``""``: the hint every unknown-name message ends with."""
    close = difflib.get_close_matches(str(name), list(known), n=3)
    return f" Did you mean {', '.join(map(repr, close))}?" if close else ""


class DeviceError(Error, RuntimeError):
    """A call on a device failed (a CUDA kernel launch, copy or cuBLAS call,
    or a GPU that cannot be used); the message carries the device's own error
    string, e.g. ``cudaErrorInsufficientDriver: CUDA driver version is
    insufficient for CUDA runtime version``."""


class DeviceUnavailable(DeviceError, NotImplementedError):
    """A device this process cannot use: ``cuda:N`` in a build without the
    CUDA backend (or whose extension does not load), or past the GPUs the
    driver shows. Raised by device placement (``Tensor.to``,
    ``Module.to``, creating a tensor there), ``load(device=...)`` and the
    CLI's ``--device``, with one wording: the device, why it cannot be used
    and what to do (``mgtrace doctor``). A NotImplementedError too, as the
    device's kernels are what is missing (MegEngine's CompNode raises when
    a device type is not compiled in)."""


class NoKernelError(Error, NotImplementedError):
    """An op has no kernel on a tensor's device for its dtype, and no
    fallback (op_table.py's ``fallback`` column): ``no kernel for op
    'conv2d_nchwc' on device cuda:0 with dtype float32``. Passes ask
    ``mgtrace.has_kernel(op, device, dtype)`` before choosing such an op."""


class ArchiveError(Error, ValueError):
    """An archive (``.tmod``) cannot be read: malformed, truncated, corrupted,
    too new, or naming something this program does not know.

    The message says what is wrong and where (``header.tensors[3].shape``),
    and, when there is one, the next step.
    """


class RegistryError(ArchiveError):
    """An archive names a function or module type that is not registered.

    Loading never imports or calls anything by the name an archive gives; the
    message names the target and how to register it
    (``mgtrace.serialization.register_function`` / ``register_module``).
    """


class VersionError(ArchiveError):
    """An archive needs a newer reader (format, function or module-type
    version), or an old version has no upgrader. The message names both
    versions."""


class AutodiffError(Error, RuntimeError):
    """A gradient cannot be computed: an op with no gradient rule on the
    path, a tensor saved for backward written in place since, a parameter
    written in place while a GradManager records it."""
