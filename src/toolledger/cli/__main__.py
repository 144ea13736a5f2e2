"""``python -m toolledger.cli``."""

import sys

from . import main

sys.exit(main())
