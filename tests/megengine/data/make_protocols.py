"""Writes cnn.p2.tm, cnn.p3.pkl and cnn.p5.tm with MegEngine 1.13 (see
make_files.py for the venv): cnn.tm loaded by MegEngine and saved again with
``pickle_protocol`` 2, 3 and 5 (MegEngine's default is 4), so the reader is
checked on every protocol it reads: protocol 2 writes bytes through
``_codecs.encode``, protocol 3 has no STACK_GLOBAL/MEMOIZE/FRAME, protocol
5 pickles NumPy arrays through ``numpy.core.numeric._frombuffer``."""
import os

import megengine as mge

HERE = os.path.dirname(os.path.abspath(__file__))

traced = mge.load(os.path.join(HERE, "cnn.tm"))
mge.save(traced, os.path.join(HERE, "cnn.p2.tm"), pickle_protocol=2)
mge.save(traced, os.path.join(HERE, "cnn.p5.tm"), pickle_protocol=5)
state = mge.load(os.path.join(HERE, "cnn.pkl"))
mge.save(state, os.path.join(HERE, "cnn.p3.pkl"), pickle_protocol=3)
