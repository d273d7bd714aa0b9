"""`python -m tuning ...` is `tunelab ...` (the lab's command)."""
import sys

from tunelab.cli import main

sys.exit(main())
