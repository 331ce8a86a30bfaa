"""Tests of mgtrace.functional and mgtrace.random (a package, so that test_nn.py
here and tests/core/test_nn.py get distinct module names)."""
