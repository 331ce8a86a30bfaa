"""ONNX export of TracedModules (the optional dependency ``onnx``:
``pip install 'mgtrace[onnx]'``).

- :func:`export`: a TracedModule (float, QAT or quantized: QDQ or
  QOperator) to an ONNX model file, checked by ``onnx.checker`` (full
  check) and shape inference before it is written.
- :func:`load`: an ONNX model (mgtrace's exports, the common ops of
  other exporters, RNN / LSTM as mgtrace's modules, ONNX Runtime's
  Attention) as an editable, saveable TracedModule.
- :func:`coverage`: what exports, as a table (op / function / builtin
  module -> ONNX ops, opsets), generated from :mod:`mgtrace.onnx.mapping`.
- :func:`max_opset`: the default opset (the newest the installed onnx and
  onnxruntime both support); any opset from 13 up to it is accepted.

Importing this package needs neither onnx nor onnxruntime; calling
:func:`export` needs onnx (and onnxruntime for ``example_inputs``).
"""
from mgtrace.onnx._builder import ExportError
from mgtrace.onnx.exporter import export, max_opset
from mgtrace.onnx.importer import OnnxImportError, load
from mgtrace.onnx.mapping import MIN_OPSET, coverage

__all__ = ["export", "load", "coverage", "max_opset", "ExportError", "OnnxImportError",
           "MIN_OPSET"]
