"""MegEngine's own files, read without running them.

``mgtrace.megengine.load(path)`` reads what ``megengine.save`` wrote: a
state dict (``.pkl``) as an OrderedDict of Tensors in MegEngine's shapes
(load it with ``module.load_state_dict(sd, layout="megengine")``), a
TracedModule (``.tm``) as an mgtrace :class:`~mgtrace.TracedModule`.

The files are pickles; they are read by mgtrace's own pickle machine
(:mod:`mgtrace.megengine.reader`, over :mod:`mgtrace.megengine.opcodes`;
Python's pickle module is never loaded), which loads and calls nothing
the file names, and MegEngine's modules and functions are mapped to mgtrace's
through one table (:mod:`mgtrace.megengine.table`). ``mgtrace
import-megengine`` converts many files to ``.tmod`` archives.

MegEngine's quantization flow comes over too: QAT models (observers and
fake quantizers with their state), calibrated models, the int8 models of
``megengine.quantization.quantize`` and their state dicts load as
:mod:`mgtrace.module.qat`, :mod:`mgtrace.module.quantized` and
:mod:`mgtrace.quantization` objects; quantized NumPy dtypes (MegEngine's
``{"mgb_dtype": ...}`` metadata, checked as data) become mgtrace's quantized
dtypes. Outputs equal MegEngine's within one quantum: its fake quantization
and int8 kernels round ties half away from zero, mgtrace's half to even.
"""
from mgtrace.megengine.convert import load, loads
from mgtrace.megengine.table import UnsupportedError
from mgtrace.megengine.reader import ForbiddenGlobalError, MegEngineFileError

__all__ = ["load", "loads", "MegEngineFileError", "ForbiddenGlobalError", "UnsupportedError"]
