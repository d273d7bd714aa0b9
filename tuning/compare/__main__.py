"""python -m tuning.compare: the command of tuning/compare/cli.py."""
from tuning.compare.cli import main

main()
