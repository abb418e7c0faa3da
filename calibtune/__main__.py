"""``python -m calibtune`` = the ``calibtune`` command."""

import sys

from calibtune.cli import main

sys.exit(main())
