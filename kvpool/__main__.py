"""``python -m kvpool`` runs the command line."""

import sys

from kvpool.cli import main

sys.exit(main())
