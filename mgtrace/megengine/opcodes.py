"""The pickle opcodes a MegEngine file may hold, decoded from the bytes.

mgtrace's own decoder, one table: each opcode's byte, its name (as the
pickle format documents them, ``Lib/pickletools.py``) and how its argument
is read. It replaces pickletools (which loads Python's pickle module
itself), so that nothing of Python's pickle machinery is loaded to read a
file.

:data:`OPCODES` holds the opcodes Python's pickler writes at protocols 2
to 5 for the values ``megengine.save`` stores (MegEngine 1.13 writes
protocol 4; NumPy's arrays at protocol 5 come in-band). :data:`REFUSED`
names the other opcodes of the format, so that a file using one is told
which: the text opcodes of protocols 0 and 1, ``INST``/``OBJ`` (call a class
by name), persistent ids and the extension registry (MegEngine writes
neither), and out-of-band buffers (none are given).
"""
import struct

from mgtrace.megengine.errors import MegEngineFileError

__all__ = ["OPCODES", "REFUSED", "read_opcode"]


class _Fixed:
    """A fixed-size little-endian (or, for floats, big-endian) number."""

    def __init__(self, fmt):
        self.s = struct.Struct(fmt)

    def __call__(self, data, pos):
        end = pos + self.s.size
        if end > len(data):
            raise MegEngineFileError(f"truncated: {self.s.size} argument bytes needed, "
                                     f"{len(data) - pos} left")
        return self.s.unpack_from(data, pos)[0], end


_U1, _U2, _U4, _U8, _I4, _F8 = (_Fixed(f) for f in ("<B", "<H", "<I", "<Q", "<i", ">d"))
_MAX_LONG_BYTES = 9        # a 61-bit int with its sign; longer ones are refused by the reader


class _Counted:
    """A length (read by ``length``) then that many bytes, made into a
    value by ``make``."""

    def __init__(self, length, make, what):
        self.length, self.make, self.what = length, make, what

    def __call__(self, data, pos):
        n, pos = self.length(data, pos)
        if n < 0 or n > len(data) - pos:
            raise MegEngineFileError(f"{self.what} of {n} bytes, past the end of the "
                                     f"{len(data)}-byte pickle")
        return self.make(data[pos:pos + n]), pos + n


def _long(raw):
    if len(raw) > _MAX_LONG_BYTES:
        raise MegEngineFileError("an int of more than 61 bits (ints that large collide in "
                                 "dicts; MegEngine's files hold none)")
    return int.from_bytes(raw, "little", signed=True)


def _utf8(raw):
    return raw.decode("utf-8", "surrogatepass")     # what Python's pickler encodes with


def _line(data, pos):
    end = data.find(b"\n", pos)
    if end < 0:
        raise MegEngineFileError("truncated: a line without its newline")
    return _utf8(data[pos:end]), end + 1


def _two_lines(data, pos):
    module, pos = _line(data, pos)
    name, pos = _line(data, pos)
    return (module, name), pos


#: byte -> (name, argument reader or None): the opcodes the reader runs
OPCODES = {
    # framing and the end
    0x80: ("PROTO", _U1), 0x95: ("FRAME", _U8), ord("."): ("STOP", None),
    # constants
    ord("N"): ("NONE", None), 0x88: ("NEWTRUE", None), 0x89: ("NEWFALSE", None),
    ord("J"): ("BININT", _I4), ord("K"): ("BININT1", _U1), ord("M"): ("BININT2", _U2),
    0x8A: ("LONG1", _Counted(_U1, _long, "an int")),
    0x8B: ("LONG4", _Counted(_I4, _long, "an int")),
    ord("G"): ("BINFLOAT", _F8),
    ord("C"): ("SHORT_BINBYTES", _Counted(_U1, bytes, "bytes")),
    ord("B"): ("BINBYTES", _Counted(_U4, bytes, "bytes")),
    0x8E: ("BINBYTES8", _Counted(_U8, bytes, "bytes")),
    0x96: ("BYTEARRAY8", _Counted(_U8, bytearray, "a bytearray")),
    0x8C: ("SHORT_BINUNICODE", _Counted(_U1, _utf8, "a string")),
    ord("X"): ("BINUNICODE", _Counted(_U4, _utf8, "a string")),
    0x8D: ("BINUNICODE8", _Counted(_U8, _utf8, "a string")),
    # containers
    ord("]"): ("EMPTY_LIST", None), ord("a"): ("APPEND", None), ord("e"): ("APPENDS", None),
    ord(")"): ("EMPTY_TUPLE", None), ord("t"): ("TUPLE", None), 0x85: ("TUPLE1", None),
    0x86: ("TUPLE2", None), 0x87: ("TUPLE3", None),
    ord("}"): ("EMPTY_DICT", None), ord("s"): ("SETITEM", None), ord("u"): ("SETITEMS", None),
    0x8F: ("EMPTY_SET", None), 0x90: ("ADDITEMS", None), 0x91: ("FROZENSET", None),
    # the stack, its marks and the memo
    ord("("): ("MARK", None), ord("0"): ("POP", None), ord("1"): ("POP_MARK", None),
    ord("2"): ("DUP", None),
    ord("q"): ("BINPUT", _U1), ord("r"): ("LONG_BINPUT", _U4), 0x94: ("MEMOIZE", None),
    ord("h"): ("BINGET", _U1), ord("j"): ("LONG_BINGET", _U4),
    # names (resolved against the reader's closed table only) and objects
    ord("c"): ("GLOBAL", _two_lines), 0x93: ("STACK_GLOBAL", None),
    ord("R"): ("REDUCE", None), 0x81: ("NEWOBJ", None), 0x92: ("NEWOBJ_EX", None),
    ord("b"): ("BUILD", None),
}

#: byte -> name: the pickle format's other opcodes, refused by name
REFUSED = {
    ord("I"): "INT", ord("L"): "LONG", ord("F"): "FLOAT", ord("S"): "STRING",
    ord("T"): "BINSTRING", ord("U"): "SHORT_BINSTRING", ord("V"): "UNICODE",
    ord("l"): "LIST", ord("d"): "DICT", ord("p"): "PUT", ord("g"): "GET",
    ord("i"): "INST", ord("o"): "OBJ", ord("P"): "PERSID", ord("Q"): "BINPERSID",
    0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4", 0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER",
}


def read_opcode(data, pos):
    """``(name, argument, next position)`` of the opcode at byte ``pos`` of
    ``data``. MegEngineFileError for a byte that is no opcode the reader
    runs, or an argument past the end of ``data``."""
    if pos >= len(data):
        raise MegEngineFileError(f"the pickle ends at byte {pos} without a STOP opcode")
    code = data[pos]
    entry = OPCODES.get(code)
    if entry is None:
        name = REFUSED.get(code)
        if name is None:
            raise MegEngineFileError(f"byte {pos} ({code:#04x}) is not a pickle opcode")
        raise MegEngineFileError(f"opcode {name} at byte {pos} is refused (not one Python's "
                                 "pickler writes at protocols 2 to 5 for MegEngine's files)")
    name, read = entry
    if read is None:
        return name, None, pos + 1
    try:
        arg, end = read(data, pos + 1)
    except MegEngineFileError as e:
        raise MegEngineFileError(f"opcode {name} at byte {pos}: {e}") from None
    except UnicodeDecodeError as e:
        raise MegEngineFileError(f"opcode {name} at byte {pos}: not UTF-8 ({e.reason})") from None
    return name, arg, end
