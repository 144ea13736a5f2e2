"""SQL shared by the SQLite and PostgreSQL backends.

``statements``: every statement, written once with ``?`` placeholders. ``schema``: both
migration lists, side by side. ``rows``: records to parameters and rows back to records.
``plans``: every read and write as a generator of statements, carried out by either backend.
"""
