"""``python -m chaos``: see chaos/run.py, or ``python -m chaos --help``."""

import sys

from chaos.run import main

sys.exit(main())
