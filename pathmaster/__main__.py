"""`python -m pathmaster ...` is the same as the `pathmaster` command."""

import sys

from pathmaster.cli import main

sys.exit(main())
