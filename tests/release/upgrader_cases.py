"""One upgrader test case for every older version of every function and
builtin module type (ONNX's rule: an op version without a converter test
fails CI; tests/release/test_coverage.py enforces it).

When a function or builtin module type goes from version v to v + 1 (its
signature or config changed; upgraders.py registers the upgrader), add::

    ("function", "mgtrace.functional.NAME", v): (
        {what version v stored, by parameter name},
        {what the current version takes, by parameter name}),

(``"builtin module type"`` and the config for builtin module types). The case runs the
whole chain from v to the current version. Every function and module type
is at version 1 today, so there is nothing to upgrade yet.
"""

CASES = {}
