"""``python -m toolledger.cli``: the ``toolledger`` command (``python -m toolledger`` too)."""

import sys

from .app import main

sys.exit(main())
