"""python -m tuning.tools.compare: the command of tuning/tools/compare/cli.py."""
from tuning.tools.compare.cli import main

main()
