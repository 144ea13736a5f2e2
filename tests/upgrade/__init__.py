"""Upgrade tests: stores written by earlier releases (``fixtures/``) must open, and every session
in them go on, with this one."""
