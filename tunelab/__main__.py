"""`python -m tunelab ...` is `tunelab ...`."""
import sys

from tunelab.cli import main

sys.exit(main())
