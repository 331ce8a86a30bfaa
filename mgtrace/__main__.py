"""``python -m mgtrace``: the mgtrace command (see mgtrace/cli.py)."""
from mgtrace.cli import main_exit

main_exit()
