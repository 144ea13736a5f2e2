"""``python -m toolledger``: the ``toolledger`` command."""

import sys

from .cli.app import main

sys.exit(main())
