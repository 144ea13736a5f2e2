"""Switches read once, when toolledger is imported.

``STRAIGHT``: the common call takes its straight path — in the engine
(``toolledger.engine._straight``) and in the SQL stores' commit of a lone effect write
(``toolledger.stores._sql.writes.lone_effect``). ``TOOLLEDGER_GENERAL_PATH=1`` turns it off for
the whole process, so that every guarantee's suite can run on the general path too
(``make pytest`` does both); nothing else differs. Tests may flip it for one scenario.
"""

from __future__ import annotations

import os

__all__ = ["STRAIGHT"]

STRAIGHT = os.environ.get("TOOLLEDGER_GENERAL_PATH", "") in ("", "0")
