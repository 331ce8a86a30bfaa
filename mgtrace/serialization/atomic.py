"""Writing a file so that a crash never leaves a half-written or clobbered one.

The data goes to a temporary file in the target's folder (same file system),
which is flushed and fsynced, then renamed over the target (``os.replace``
is atomic on POSIX and Windows), and the folder is fsynced so the rename
survives a power loss. On any error the temporary file is removed and the
target is untouched; a killed process may leave a ``.<name>.<random>.tmp``
beside it, never a partial file under the target's name.
"""
import io
import os
import secrets
import stat
from contextlib import contextmanager

__all__ = ["open_for_writing", "fsync_dir"]


def fsync_dir(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:          # e.g. Windows: folders cannot be opened
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def _atomic(path):
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    try:        # created inside the try, so an exception at any point removes it
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        if os.path.isfile(path):         # keep an existing archive's permissions
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(directory)


@contextmanager
def open_for_writing(f):
    """A binary file to write an archive to.

    ``f`` is a path (str, bytes or os.PathLike: written atomically, see the
    module docstring) or a writable binary file object (written in place,
    from its current position; atomicity is then the caller's business).

    Raises:
        TypeError: ``f`` is neither.
        OSError: the folder is missing or not writable, or the rename fails.
    """
    if isinstance(f, (str, bytes, os.PathLike)):
        path = os.fsdecode(f)
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"cannot save {path}: no such folder {folder}")
        if os.path.isdir(path):
            raise IsADirectoryError(f"cannot save to {path}: it is a folder; give a file name "
                                    f"such as {os.path.join(path, 'model.tmod')}")
        with _atomic(path) as out:
            yield out
    elif isinstance(f, io.TextIOBase):
        raise TypeError("save writes binary data: open the file with mode 'wb', not 'w'")
    elif hasattr(f, "write"):
        yield f
    else:
        raise TypeError(f"save takes a path or a binary file object, got {type(f).__name__}")
