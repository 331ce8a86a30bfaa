"""``python -m mgtrace``: the mgtrace command (see mgtrace/cli/__init__.py)."""
from mgtrace.cli import main_exit

main_exit()
