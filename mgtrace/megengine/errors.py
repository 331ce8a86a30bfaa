"""The errors of mgtrace.megengine's reader (re-exported by
:mod:`mgtrace.megengine`)."""
from mgtrace.errors import Error

__all__ = ["MegEngineFileError", "ForbiddenGlobalError"]


class MegEngineFileError(Error, ValueError):
    """A MegEngine file (a ``.pkl`` state dict or a ``.tm`` traced module)
    cannot be read or converted: malformed, truncated, over a bound, or
    holding something with no mgtrace counterpart. The message says what
    and where."""


class ForbiddenGlobalError(MegEngineFileError):
    """The pickle names a global outside the reader's allowlist (``os.system``,
    ``builtins.eval``, a class of another library...). Nothing it names is
    imported or called; the message names the global."""
