"""mgtrace's exception classes that are not tied to one layer.

Each also subclasses the matching builtin (STYLE.md item 6), so callers may
catch either ``mgtrace.ArchiveError`` or plain ``ValueError``.
"""

__all__ = ["ArchiveError", "RegistryError", "VersionError"]


class ArchiveError(ValueError):
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
