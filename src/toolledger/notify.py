"""Notifications: tell a person the moment a call needs them — a request queued for approval,
a call left in doubt — by a callable or a signed webhook (``Notifier``); a receiver checks the
signature with ``verify_signature``. See ``toolledger.approvals._notify``."""

from __future__ import annotations

from .approvals._notify import Notifier, notifier, verify_signature

__all__ = ["Notifier", "notifier", "verify_signature"]
