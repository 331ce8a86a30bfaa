"""Writing a file so that a crash never leaves a half-written or clobbered one.

The data goes to a temporary file ``.<name>.<12 hex digits>.tmp`` in the
target's folder (same file system), which is flushed and fsynced, then
renamed over the target (``os.replace`` is atomic on POSIX and Windows), and
the folder is fsynced so the rename survives a power loss. On any error the
temporary file is removed and the target is untouched.

A target that is a symbolic link is written through: the file it points to
is replaced (keeping its permissions, and its owner where the writer may
give it) and the link stays a link; links that form a loop are refused.

A killed writer cannot remove its temporary file, so each writer holds an
exclusive ``flock`` on its own for as long as it lives; the next save to the
same target removes the temporary files whose lock is free (their writer is
dead), never a live writer's. :func:`leftovers` lists such files in a folder
(``mgtrace verify`` reports them). Without ``fcntl`` (Windows) nothing is
locked and leftovers are only listed.
"""
import errno
import io
import os
import re
import secrets
import stat
from contextlib import contextmanager

try:
    import fcntl
except ImportError:          # Windows: no flock; leftovers are listed, never removed
    fcntl = None

__all__ = ["open_for_writing", "replacing", "fsync_dir", "leftovers", "remove_stale"]

_TEMP = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{12}\.tmp")


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


def _lock(fd, block=False):
    """Whether this process now holds the exclusive lock on ``fd``."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
        return True
    except OSError:          # BlockingIOError: another process holds it
        return False


def _same_file(fd, path):
    try:
        a, b = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _temp_name(path):
    directory, base = os.path.split(path)
    return os.path.join(directory, f".{base}.{secrets.token_hex(6)}.tmp")


def _open_temp(tmp):
    """A descriptor of the new file ``tmp``, locked, or None when a cleaner
    removed it in the instant before its lock was taken (make another)."""
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    if _lock(fd, block=True) and _same_file(fd, tmp):
        return fd
    os.close(fd)
    return None


def _stale(folder, name):
    """Whether ``folder/name`` is a temporary file whose writer is dead;
    with ``fcntl``, taking its lock proves that (the lock is kept by the
    caller: see remove_stale)."""
    p = os.path.join(folder, name)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    if fcntl is not None and _lock(fd) and _same_file(fd, p):
        return fd
    os.close(fd)
    return None


def remove_stale(path):
    """Remove the temporary files of dead writers of target ``path``
    (``.<name>.<hex>.tmp`` beside it whose lock is free); returns their
    paths. Live writers' files are never touched; without fcntl nothing
    is removed."""
    folder, base = os.path.split(os.path.abspath(path))
    removed = []
    if fcntl is None:
        return removed
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        m = _TEMP.fullmatch(name)
        if not m or m.group("name") != base:
            continue
        fd = _stale(folder, name)
        if fd is None:
            continue
        try:                   # unlinked while we hold its lock: no writer can be using it
            os.unlink(os.path.join(folder, name))
            removed.append(os.path.join(folder, name))
        except OSError:
            pass
        finally:
            os.close(fd)
    return removed


def leftovers(folder):
    """``[(path, size in bytes)]`` of the temporary files in ``folder`` (not
    below it) left by writers that died (interrupted saves); files that a
    live writer holds are not listed."""
    out = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return out
    for name in names:
        if not _TEMP.fullmatch(name):
            continue
        p = os.path.join(folder, name)
        if fcntl is None:
            live = False
        else:
            fd = _stale(folder, name)
            live = fd is None
            if fd is not None:
                os.close(fd)
        if not live:
            try:
                out.append((p, os.stat(p, follow_symlinks=False).st_size))
            except OSError:
                pass
    return out


def _target(path):
    """The file a write to ``path`` replaces: ``path`` itself, or the file a
    symbolic link at ``path`` points to (through every link; a dangling link
    names the file to create).

    Raises:
        OSError: the links form a loop (ELOOP), as ``open`` would say.
    """
    if not os.path.islink(path):
        return os.path.abspath(path)
    try:
        return os.path.realpath(path, strict=True)
    except FileNotFoundError:
        return os.path.realpath(path)
    except OSError as e:
        raise OSError(errno.ELOOP, f"cannot save {path}: its symbolic links form a loop") from e


def _keep_mode_and_owner(tmp, st):
    os.chmod(tmp, stat.S_IMODE(st.st_mode))
    if hasattr(os, "chown") and (st.st_uid, st.st_gid) != (os.getuid(), os.getgid()):
        try:                # root rewriting a user's file: keep it theirs
            os.chown(tmp, st.st_uid, st.st_gid)
        except PermissionError:
            pass            # not ours to give away: it becomes the writer's, as cp would
        os.chmod(tmp, stat.S_IMODE(st.st_mode))       # chown may clear set-id bits


@contextmanager
def replacing(path):
    """``(file, temp path)``: a locked temporary file beside ``path``'s
    target, open for binary writing. When the block ends without an
    exception the file is flushed, fsynced, given the target's permissions
    and renamed over the target (through a symbolic link, see the module
    docstring); on any exception (Ctrl-C included) it is removed and the
    target is untouched. Temporary files of dead writers of the same target
    are removed first.

    Raises:
        FileNotFoundError: the target's folder does not exist.
        OSError: the folder is not writable, or the rename fails.
    """
    target = _target(path)
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot save {path}: no such folder {folder}")
    remove_stale(target)
    tmp = fd = None
    try:        # named before it is created, inside the try: a stop at any line removes it
        while fd is None:
            tmp = _temp_name(target)
            try:
                fd = _open_temp(tmp)
            except FileExistsError:      # another writer's name (48 random bits): not ours
                tmp = None
        with os.fdopen(fd, "w+b") as out:
            yield out, tmp
            out.flush()
            os.fsync(out.fileno())
            if os.path.isfile(target):         # keep an existing archive's permissions
                _keep_mode_and_owner(tmp, os.stat(target))
            os.replace(tmp, target)            # still locked: no cleaner can take it
    except BaseException:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        raise
    fsync_dir(folder)


@contextmanager
def open_for_writing(f, example_name="model.tmod"):
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
        if not path:
            # abspath("") is the working folder: the rename over it failed with
            # the temporary file's name in the message
            raise FileNotFoundError(f"cannot save to an empty path; give a file name such as "
                                    f"{example_name}")
        if os.path.isdir(path):
            raise IsADirectoryError(f"cannot save to {path}: it is a folder; give a file name "
                                    f"such as {os.path.join(path, example_name)}")
        with replacing(path) as (out, _):
            yield out
    elif isinstance(f, io.TextIOBase):
        raise TypeError("save writes binary data: open the file with mode 'wb', not 'w'")
    elif hasattr(f, "write"):
        yield f
    else:
        raise TypeError(f"save takes a path or a binary file object, got {type(f).__name__}")
