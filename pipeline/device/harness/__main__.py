"""`python -m harness` (in a bundle) or `python -m pipeline.device.harness`: the command line."""

import sys

from .cli import main

sys.exit(main())
