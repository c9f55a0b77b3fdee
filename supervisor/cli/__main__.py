"""`python -m forq.supervisor.cli`: the `forq` command."""

import sys

from forq.supervisor.cli.main import main

sys.exit(main())
