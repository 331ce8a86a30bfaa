"""The promotion examples of the docs, as data: tests/core/test_promotion.py
runs exactly these, so the documented table and the checked one are one.

Each row: (left, op, right, expected result dtype). A str names a tensor of
that dtype; a Python bool/int/float is a scalar operand.
"""
EXAMPLES = [
    # scalar vs tensor: a scalar only matters when its category is higher
    ("int16", "+", 1, "int16"),
    ("int16", "+", 1.0, "float32"),
    ("int8", "+", 3, "int8"),
    ("int8", "+", 3.0, "float32"),
    ("float16", "*", 3.0, "float16"),
    ("bool", "+", 1, "int32"),
    ("bool", "+", True, "bool"),
    ("uint8", "+", 10, "uint8"),
    # tensor vs tensor: NumPy's table within the highest category
    ("uint8", "+", "int8", "int16"),
    ("int16", "+", "float32", "float32"),
    ("int32", "+", "float16", "float16"),
    ("int64", "+", "bfloat16", "bfloat16"),
    ("float16", "+", "bfloat16", "float32"),
    ("bool", "+", "bool", "bool"),
    ("int32", "+", "int64", "int64"),
    ("float32", "+", "float64", "float64"),
    # ops with their own rule: true division, power and transcendentals give float32
    ("int32", "/", "int32", "float32"),
    ("int8", "/", 2, "float32"),
    ("float16", "/", 2, "float16"),
    # power: MegEngine computes POW of integer operands in float32, so a
    # negative exponent is a fraction (2 ** -1 == 0.5), never an integer 0
    ("int32", "**", -1, "float32"),
    ("int8", "**", 2, "float32"),
    ("int32", "**", "int32", "float32"),
    ("float16", "**", 2, "float16"),
    ("int32", "==", 1.5, "bool"),
    # complex, the category above float: a complex operand wins; a Python
    # complex stands for complex64, MegEngine's complex dtype
    ("float32", "+", 1j, "complex64"),
    ("int8", "*", 2j, "complex64"),
    ("float64", "+", "complex64", "complex64"),
    ("complex64", "+", "complex128", "complex128"),
    ("complex64", "*", 2.0, "complex64"),
    ("complex128", "/", 2, "complex128"),
    ("complex64", "==", 1.5, "bool"),
]
