"""``python -m otviz``: the ``otviz`` command, also the module ``torchrun`` starts in each
process of a data-parallel job (``torchrun --nproc-per-node 2 -m otviz train ...``)."""

import sys

from otviz.cli import main

sys.exit(main())
