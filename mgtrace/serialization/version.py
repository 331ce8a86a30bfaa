"""Format versions and the rules for reading across them (DESIGN.md, "Versions").

``FORMAT_VERSION`` is ``(major, minor)`` of what this program writes. A
writer records it as ``format_version`` and, as ``min_reader_version``, the
lowest version that understands every feature the archive actually uses
(header fields, value tags, module kinds each carry the version that
introduced them). A reader

* refuses a newer major, or a ``min_reader_version`` above its own version,
  with a message naming both versions;
* reads a newer minor whose ``min_reader_version`` it meets, ignoring
  optional fields it does not know (a minor release may only add those)
  and keeping those of the header, module and tensor entries for a re-save
  at the archive's own version (unknown.py);
* reads an older major through :data:`FORMAT_UPGRADERS`, one step per major
  (there is none yet: 1 is the first major).

A writer records as ``format_version`` the newest version whose features the
archive uses (an archive that uses nothing of 1.1 is a 1.0 archive), and
``save(..., target_version=(1, 0))`` writes for an older reader: optional
newer fields are left out, and a feature that reader cannot do without is
refused naming it (:func:`check_target`).
"""
import functools
import os
import re

from mgtrace.errors import ArchiveError, VersionError

FORMAT_NAME = "mgtrace.tmod"
FORMAT_VERSION = (1, 2)

# major -> function(header) -> header of major + 1; each new major ships one.
FORMAT_UPGRADERS = {}


def fmt(version):
    """``"1.0"`` for ``(1, 0)``."""
    return ".".join(str(v) for v in version)


def check_target(target):
    """``target`` as a ``(major, minor)`` tuple a writer can write.

    Raises:
        ValueError: not a released format version this writer knows
            (1.0 up to :data:`FORMAT_VERSION`).
    """
    try:
        t = tuple(int(v) for v in target)
    except (TypeError, ValueError):
        raise ValueError(f"target_version must be (major, minor), got {target!r}") from None
    if len(t) != 2 or not (1, 0) <= t <= FORMAT_VERSION:
        raise ValueError(f"target_version {target!r}: this mgtrace writes formats 1.0 to "
                         f"{fmt(FORMAT_VERSION)}")
    return t


def is_current(format_version):
    """Whether ``save`` would write an archive of ``format_version`` in that
    same version again (nothing to upgrade): every archive it writes is at
    least 1.1 (the header seal), and a newer minor only one that uses a
    feature of it, so 1.1 up to FORMAT_VERSION is current."""
    return (1, 1) <= tuple(format_version) <= FORMAT_VERSION


def released_names(version):
    """``{"functions": {name: version}, "module_types": {name: version}}``:
    mgtrace's own stable names as format ``version`` had them (a frozen copy
    of that release's schema/ops.json in released_ops/), or None for the
    current format."""
    if tuple(version) == FORMAT_VERSION:
        return None
    return _released(tuple(version))


@functools.lru_cache(maxsize=None)
def _released(version):
    import json
    path = os.path.join(os.path.dirname(__file__), "released_ops", f"{fmt(version)}.json")
    with open(path) as f:
        table = json.load(f)
    return {k: {n: v if isinstance(v, int) else v["version"] for n, v in table[k].items()}
            for k in ("functions", "module_types")}


def check_readable(format_version, min_reader_version, producer=None):
    """Raise unless this reader may read an archive with these versions.

    ``producer`` (the header's ``{"library", "version"}``) names the writer
    in the messages. Each refusal names the archive's format, its writer,
    the formats this reader reads and what to do (load it with the writer's
    release or a newer one).

    Raises:
        VersionError: newer major, ``min_reader_version`` above
            :data:`FORMAT_VERSION`, or an older major without an upgrader.
        ArchiveError: ``min_reader_version`` above ``format_version``.
    """
    fv, mv = tuple(format_version), tuple(min_reader_version)
    by = f" by {_producer(producer)}" if producer else ""
    if mv > fv:
        raise ArchiveError(f"inconsistent versions: min_reader_version {fmt(mv)} is above "
                           f"format_version {fmt(fv)}")
    if fv[0] > FORMAT_VERSION[0]:       # a new major may change anything: min_reader_version aside
        raise VersionError(f"this archive is format {fmt(fv)} (written{by}), a newer major "
                           f"version; {reader_range()}: {_what_to_do(producer, fv)}")
    if mv > FORMAT_VERSION:
        raise VersionError(f"this archive needs an mgtrace that reads format {fmt(mv)} (it was "
                           f"written as format {fmt(fv)}{by}); {reader_range()}: "
                           f"{_what_to_do(producer, mv)}")
    for major in range(fv[0], FORMAT_VERSION[0]):
        if major not in FORMAT_UPGRADERS:
            raise VersionError(f"archive format {fmt(fv)} (written{by}) is older than "
                               f"{fmt(FORMAT_VERSION)} and there is no upgrader from major "
                               f"version {major}; {reader_range()}")


def reader_range():
    """``"this reader (mgtrace 0.3.0) reads formats 1.0 to 1.2"``."""
    return f"this reader ({_library_version()}) reads formats 1.0 to {fmt(FORMAT_VERSION)}"


def _what_to_do(producer, needed):
    """The advice for an archive this reader cannot read: the writer's
    release (or a newer one) reads it, when that is a newer mgtrace, else
    one that reads format ``needed``; that release can also write it for
    this reader."""
    if _newer_mgtrace(producer):
        where = f"load it with mgtrace >= {producer['version']}"
    else:
        where = f"load it with an mgtrace that reads format {fmt(needed)}"
    return (f"{where}, or have it saved there with target_version="
            f"({FORMAT_VERSION[0]}, {FORMAT_VERSION[1]}) for this reader")


def from_newer_writer(header):
    """Whether ``header`` (checked by :func:`check_readable`) comes from a
    newer format minor or a newer mgtrace than this one: what it holds that
    this reader does not know (a function version, a value tag, a dtype) is
    then reported with :func:`newer_writer_note`."""
    return tuple(header["format_version"]) > FORMAT_VERSION or _newer_mgtrace(header["producer"])


def _newer_mgtrace(producer):
    """Whether ``producer`` (file data) names an mgtrace release newer than this one."""
    if not isinstance(producer, dict) or producer.get("library") != "mgtrace":
        return False
    theirs = producer.get("version")
    theirs = version_key(theirs) if isinstance(theirs, str) and len(theirs) <= 40 else None
    ours = version_key(_library_version().split()[-1])
    return theirs is not None and ours is not None and theirs > ours


def newer_writer_note(header):
    """``"; this archive is format 1.3, written by mgtrace 0.4.0; this reader
    ... : load it with mgtrace >= 0.4.0, ..."``, appended to a message about
    something of ``header`` this reader does not know."""
    fv = tuple(header["format_version"])
    return (f" (this archive is format {fmt(fv)}, written by {_producer(header['producer'])}; "
            f"{reader_range()}: {_what_to_do(header['producer'], fv)})")


_RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)(?:\.dev(\d+)|(a|b|rc)(\d+))?")
_STAGES = {"dev": 0, "a": 1, "b": 2, "rc": 3, None: 4}


def version_key(text):
    """A sort key of an mgtrace release number (PEP 440's ``X.Y.Z``,
    ``X.Y.Z.devN``, ``X.Y.ZaN``, ``X.Y.ZbN``, ``X.Y.ZrcN``: a dev release
    before its pre-releases, before the release), or None for another form."""
    m = _RELEASE.fullmatch(text) if isinstance(text, str) else None
    if m is None:
        return None
    major, minor, micro, dev, pre, pre_n = m.groups()
    stage, n = ("dev", dev) if dev is not None else (pre, pre_n)
    return int(major), int(minor), int(micro), _STAGES[stage], int(n or 0)


def _library_version():
    import mgtrace
    return f"mgtrace {mgtrace.__version__}"


def _producer(producer):
    """``"mgtrace 0.1.0"`` from a header's producer (shortened: it is file data)."""
    if not isinstance(producer, dict):
        return "an unknown writer"
    text = " ".join(str(producer.get(k, "?")) for k in ("library", "version"))
    return text if len(text) <= 60 else text[:57] + "..."


def upgrade_header(header):
    """Run :data:`FORMAT_UPGRADERS` from the header's major to ours."""
    for major in range(header["format_version"][0], FORMAT_VERSION[0]):
        header = FORMAT_UPGRADERS[major](header)
    return header
