"""``json:///dir`` — the brief's ``effects.json``: one human-readable file per session.

Each file maps ``tool_use_id`` to a record (``{name, result, at, status, …}``) and is rewritten
*whole* for every state change: written to a temporary file, fsynced, renamed over the old one,
and the directory fsynced. A crash leaves the old file or the new one, never half of one.

The cost grows with the session: a rewrite per record is fine for tens or hundreds of calls and
for reading by eye, not for long sessions (use ``sqlite:///``). Every record carries a digest of
its fields, so truncation, a flipped byte or a hand edit is detected and raised as
``CorruptLedgerError`` — never read as an empty ledger, which would re-run every effect.

An agent session adds ``<session>.session.jsonl``: its checkpoints, one line per commit (state,
appended messages, approvals), append-only, each line with a digest. Appending keeps a
checkpoint's cost flat however long the conversation; a last line without its newline is a commit
that never finished (its fsync never returned) and is ignored, and anything else that does not
check out is ``CorruptLedgerError``. A commit that touches both files writes the ledger first, so
a crash between the two leaves a recorded effect whose checkpoint is missing — which a resume
answers from the ledger — never the reverse.

One commit is the exception: the one that creates a session together with records (a fork
copies the ledger records it keeps into a brand-new session). Ledger first, a crash between the
two would leave records of a session that was never created. So, when no ledger file exists yet,
its log line — the commit point — carries the records, and the ledger file is written after it.
A crash before the line's fsync leaves nothing (a torn last line is ignored); after it, the
session is there with every record: while the ledger file is missing, the ledger is read from
the records its creating line carries, and the next commit that writes records writes the file
from them. The line keeps them afterwards, unused once the file exists.

A rewind's abandoned messages (``AbandonMessages``) are kept in the log too: its line records
the rewind, and reading the log moves the transcript's tail to the abandoned branch as the
commit did. The session's two files hold all of it, so removing them removes the branches.

The package: ``_files`` (names, the write lock, atomic writes, appends), ``_codec`` (records and
log entries to and from JSON), ``_backend`` (``JSONBackend``: load, cache, apply).
"""

from __future__ import annotations

from ._backend import JSONBackend
from ._files import LOG_SUFFIX, SUFFIX, file_stem, legacy_stem

__all__ = ["LOG_SUFFIX", "SUFFIX", "JSONBackend", "file_stem", "legacy_stem"]
