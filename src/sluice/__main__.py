"""`python -m sluice`: the `sluice` command (sluice/cli.py), for environments without the script on PATH."""

import sys

from sluice.cli import main

sys.exit(main())
