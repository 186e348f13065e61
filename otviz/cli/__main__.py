"""``python -m otviz.cli``: the ``otviz`` command."""

import sys

from otviz.cli import main

sys.exit(main())
