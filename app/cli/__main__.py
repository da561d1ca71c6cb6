"""``python -m calibd.cli``: the ``calibd`` command."""

import sys

from . import main

sys.exit(main())
