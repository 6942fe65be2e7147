"""`python -m kvbench.cli` is `kvbench`."""

import sys

from kvbench.cli.main import main

sys.exit(main())
