"""``python -m tests.mutants``: see :mod:`tests.mutants.runner`."""

import sys

from .runner import main

sys.exit(main())
