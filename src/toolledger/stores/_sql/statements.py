"""Every statement the SQL backends run, written once with ``?`` placeholders.

The PostgreSQL backend rewrites them to ``%s`` (``format_style``, cached). Only our own
constants ever reach SQL text; every value travels as a parameter.
"""

from __future__ import annotations

from ...ops import PRUNABLE, TakeLease, UpdateEffect

EFFECT_COLUMNS = (
    "session_id, tool_use_id, tool, input_hash, status, attempt, result, error, "
    "created_at, updated_at, approved_by, worker, holder, lease_token, deadline, history, "
    "boot_deadline, made_in, origin"
)

INSERT_EFFECT = (
    f"INSERT INTO effects ({EFFECT_COLUMNS}) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (session_id, tool_use_id) DO NOTHING"
)

# Compare-and-set: the WHERE clause is the whole concurrency story. A writer that lost the race
# (or a stale one) matches no row and learns it from the row count.
UPDATE_EFFECT = (
    "UPDATE effects SET tool = ?, input_hash = ?, status = ?, attempt = ?, result = ?, "
    "error = ?, created_at = ?, updated_at = ?, approved_by = ?, worker = ?, holder = ?, "
    "lease_token = ?, deadline = ?, history = ?, boot_deadline = ?, made_in = ?, origin = ? "
    "WHERE session_id = ? AND tool_use_id = ? AND status = ? AND attempt = ?"
)
UPDATE_EFFECT_AT = UPDATE_EFFECT + " AND updated_at = ?"
# ... and by that worker, in that process: the clean-up of an intent whose commit went
# unconfirmed (``UpdateEffect.expect_worker``, ``UpdateEffect.expect_holder``).
_BY = " AND worker = ? AND coalesce(holder, '') = ?"
UPDATE_EFFECT_BY = UPDATE_EFFECT_AT + _BY


def update_statement(op: UpdateEffect) -> str:
    if op.expect_at is None:
        return UPDATE_EFFECT
    return UPDATE_EFFECT_AT if op.expect_worker is None else UPDATE_EFFECT_BY


# PostgreSQL only: an intent's deadline, set on this process's reading of the server's clock, is
# written only if the server's clock agrees with that reading within CLOCK_TOLERANCE seconds —
# the reading carried forward to the start of the try that sends it (the parameter that follows
# the deadline's), the server's clock read at the start of its transaction (the statement's own,
# in autocommit), so the time a large batch takes to arrive and to run before the intent is no
# error; otherwise the statement fails with "cannot take logarithm of zero" (CLOCK_REFUSED), and
# nothing of its transaction lands. Nothing else of ours takes a logarithm.
CLOCK_TOLERANCE = 1.0
CLOCK_REFUSED = "2201E"
_CHECKED_DEADLINE = (
    "?::float8 + 0 * ln((abs(extract(epoch FROM transaction_timestamp())::float8 - ?::float8) "
    f"<= {CLOCK_TOLERANCE})::int::float8)"
)
_DEADLINE_AT = 14  # the deadline's place among an effect's values (``rows.effect_values``)
INSERT_EFFECT_CLOCKED = INSERT_EFFECT.replace(
    "VALUES (" + "?, " * 18 + "?)",
    "VALUES ("
    + ", ".join(["?"] * _DEADLINE_AT + [_CHECKED_DEADLINE] + ["?"] * (18 - _DEADLINE_AT))
    + ")",
)
UPDATE_EFFECT_CLOCKED = UPDATE_EFFECT.replace(
    "lease_token = ?, deadline = ?,", f"lease_token = ?, deadline = {_CHECKED_DEADLINE},"
)
UPDATE_EFFECT_AT_CLOCKED = UPDATE_EFFECT_CLOCKED + " AND updated_at = ?"
UPDATE_EFFECT_BY_CLOCKED = UPDATE_EFFECT_AT_CLOCKED + _BY
assert INSERT_EFFECT_CLOCKED != INSERT_EFFECT and UPDATE_EFFECT_CLOCKED != UPDATE_EFFECT


def clocked_update_statement(op: UpdateEffect) -> str:
    if op.expect_at is None:
        return UPDATE_EFFECT_CLOCKED
    return UPDATE_EFFECT_AT_CLOCKED if op.expect_worker is None else UPDATE_EFFECT_BY_CLOCKED


SELECT_EFFECTS = f"SELECT {EFFECT_COLUMNS} FROM effects WHERE session_id = ?"
SELECT_EFFECT = f"SELECT {EFFECT_COLUMNS} FROM effects WHERE session_id = ? AND tool_use_id = ?"
# PostgreSQL only: the ids travel as one array parameter, one round trip for any number.
SELECT_SOME_EFFECTS = SELECT_EFFECTS + " AND tool_use_id = ANY(?)"
# The ids alone: what opening a session checks its transcript against, without reading records.
SELECT_EFFECT_IDS = "SELECT tool_use_id FROM effects WHERE session_id = ?"
SELECT_IN_DOUBT = f"SELECT {EFFECT_COLUMNS} FROM effects WHERE status = 'started'"

# -- sessions, transcripts, approvals ------------------------------------------------------------

SESSION_COLUMNS = (
    "session_id, status, reason, version, turns, input_tokens, output_tokens, messages, "
    "created_at, updated_at, lineage"
)
INSERT_SESSION = (
    f"INSERT INTO sessions ({SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (session_id) DO NOTHING"
)
UPDATE_SESSION = (
    "UPDATE sessions SET status = ?, reason = ?, version = ?, turns = ?, input_tokens = ?, "
    "output_tokens = ?, messages = ?, created_at = ?, updated_at = ?, lineage = ? "
    "WHERE session_id = ? AND version = ?"
)
SELECT_SESSION = f"SELECT {SESSION_COLUMNS} FROM sessions WHERE session_id = ?"
SELECT_SESSIONS = f"SELECT {SESSION_COLUMNS} FROM sessions"
SELECT_ALL_SESSION_IDS = (
    "SELECT session_id FROM sessions UNION SELECT DISTINCT session_id FROM effects"
)

INSERT_MESSAGE = (
    "INSERT INTO messages (session_id, seq, role, content, created_at) VALUES (?, ?, ?, ?, ?)"
)
# The first message of an append: inserted only if its seq is the transcript's next, so one
# statement both checks and writes (its seq and the session id come again at the end).
INSERT_NEXT_MESSAGE = (
    "INSERT INTO messages (session_id, seq, role, content, created_at) SELECT ?, ?, ?, ?, ? "
    "WHERE ? = coalesce((SELECT max(seq) + 1 FROM messages WHERE session_id = ?), 0)"
)
SELECT_LAST_SEQ = "SELECT max(seq) FROM messages WHERE session_id = ?"
SELECT_MESSAGES = (
    "SELECT seq, role, content, created_at FROM messages WHERE session_id = ? AND seq >= ? "
    "ORDER BY seq"
)

# A rewind (AbandonMessages) is three statements. The first is its guard: the branch's own row,
# inserted only if its number is free and the transcript reaches ``from_seq`` (the session id,
# branch and from_seq, then from_seq and the session id again). Then the transcript's tail is
# copied to the branch under the seqs it had, and taken out of the transcript.
ABANDON_BRANCH = (
    "INSERT INTO abandoned_branches (session_id, branch, from_seq) SELECT ?, ?, ? "
    "WHERE ? BETWEEN 0 AND coalesce((SELECT max(seq) + 1 FROM messages WHERE session_id = ?), 0) "
    "ON CONFLICT (session_id, branch) DO NOTHING"
)
ABANDON_MESSAGES = (
    "INSERT INTO abandoned_messages (session_id, branch, seq, role, content, created_at) "
    "SELECT session_id, ?, seq, role, content, created_at FROM messages "
    "WHERE session_id = ? AND seq >= ?"
)
DELETE_MESSAGES_FROM = "DELETE FROM messages WHERE session_id = ? AND seq >= ?"
# Every branch, one without messages included (its message columns NULL).
SELECT_ABANDONED = (
    "SELECT b.branch, m.seq, m.role, m.content, m.created_at FROM abandoned_branches AS b "
    "LEFT JOIN abandoned_messages AS m ON m.session_id = b.session_id AND m.branch = b.branch "
    "WHERE b.session_id = ? ORDER BY b.branch, m.seq"
)

APPROVAL_COLUMNS = (
    "session_id, tool_use_id, tool, input_hash, input, in_doubt, reason, status, "
    "requested_at, decided_at, decided_by, used_at, attempt"
)
INSERT_APPROVAL = (
    f"INSERT INTO approvals ({APPROVAL_COLUMNS}) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (session_id, tool_use_id) DO NOTHING"
)
UPDATE_APPROVAL = (
    "UPDATE approvals SET tool = ?, input_hash = ?, input = ?, in_doubt = ?, reason = ?, "
    "status = ?, requested_at = ?, decided_at = ?, decided_by = ?, used_at = ?, attempt = ? "
    "WHERE session_id = ? AND tool_use_id = ? AND status = ?"
)
SELECT_APPROVALS = f"SELECT {APPROVAL_COLUMNS} FROM approvals"
SELECT_SESSION_APPROVALS = f"SELECT {APPROVAL_COLUMNS} FROM approvals WHERE session_id = ?"

# -- leases --------------------------------------------------------------------------------------

LEASE_COLUMNS = "session_id, owner, token, expires_at, holder, renewals, ttl"
SELECT_LEASE = f"SELECT {LEASE_COLUMNS} FROM leases WHERE session_id = ?"
INSERT_LEASE = (
    f"INSERT INTO leases ({LEASE_COLUMNS}) VALUES (?, ?, ?, ?, ?, 0, ?) "
    "ON CONFLICT (session_id) DO NOTHING"
)
# Take-over and fence are compare-and-set on the token (and, for a take-over, on the expiry and
# the renewal count the taker judged, which a renewal changes): the WHERE clause is the whole
# story.
TAKE_LEASE = (
    "UPDATE leases SET owner = ?, token = ?, expires_at = ?, holder = ?, renewals = 0, ttl = ? "
    "WHERE session_id = ? AND token = ? AND expires_at = ? AND renewals = ?"
)
TAKE_LEASE_ANY_EXPIRY = (
    "UPDATE leases SET owner = ?, token = ?, expires_at = ?, holder = ?, renewals = 0, ttl = ? "
    "WHERE session_id = ? AND token = ?"
)


def take_lease_statement(op: TakeLease) -> str:
    if op.expect_token == 0:
        return INSERT_LEASE
    return TAKE_LEASE_ANY_EXPIRY if op.expect_expires_at is None else TAKE_LEASE


# A lease given back (expires_at 0) is never renewed: a renewal that was under way when its run
# ended cannot bring it back to life.
HOLD_LEASE = (
    "UPDATE leases SET expires_at = ?, renewals = renewals + 1 "
    "WHERE session_id = ? AND token = ? AND expires_at > 0"
)

# PostgreSQL only: a lease's expiry, set on this process's reading of the server's clock, is
# written as the server's clock would set it — ``clock_timestamp()`` plus the lease's time to
# live — when the two are more than CLOCK_TOLERANCE apart (the clock stepped since the reading,
# or the write waited): a lease is never written already expired, nor long past its time to
# live. The expiry written is then not the one sent; only a read tells it, and a take-over
# compares the expiry it read.
_NOW = "extract(epoch FROM clock_timestamp())::float8"
_EXPIRY = (
    "CASE WHEN {ttl} IS NULL OR abs(" + _NOW + " + {ttl} - ?::float8) <= "
    f"{CLOCK_TOLERANCE} THEN ?::float8 ELSE " + _NOW + " + {ttl} END"
)
HOLD_LEASE_CLOCKED = HOLD_LEASE.replace(
    "SET expires_at = ?,", "SET expires_at = " + _EXPIRY.format(ttl="ttl") + ","
)
_TAKEN_EXPIRY = _EXPIRY.format(ttl="?::float8").replace("?::float8 IS NULL OR ", "")
INSERT_LEASE_CLOCKED = INSERT_LEASE.replace(
    "VALUES (?, ?, ?, ?, ?, 0, ?)", f"VALUES (?, ?, ?, {_TAKEN_EXPIRY}, ?, 0, ?)"
)
TAKE_LEASE_CLOCKED = TAKE_LEASE.replace(
    "expires_at = ?, holder", f"expires_at = {_TAKEN_EXPIRY}, holder"
)
TAKE_LEASE_ANY_EXPIRY_CLOCKED = TAKE_LEASE_ANY_EXPIRY.replace(
    "expires_at = ?, holder", f"expires_at = {_TAKEN_EXPIRY}, holder"
)
assert HOLD_LEASE_CLOCKED != HOLD_LEASE and INSERT_LEASE_CLOCKED != INSERT_LEASE
assert TAKE_LEASE_CLOCKED != TAKE_LEASE != TAKE_LEASE_ANY_EXPIRY_CLOCKED


def clocked_take_lease_statement(op: TakeLease) -> str:
    if op.expect_token == 0:
        return INSERT_LEASE_CLOCKED
    return TAKE_LEASE_ANY_EXPIRY_CLOCKED if op.expect_expires_at is None else TAKE_LEASE_CLOCKED


# A fence that does not renew, alone: the same compare-and-set, writing the expiry it found. An
# UPDATE, so that (on PostgreSQL) the lease row stays locked until the transaction ends.
CHECK_LEASE = (
    "UPDATE leases SET expires_at = expires_at "
    "WHERE session_id = ? AND token = ? AND expires_at > 0"
)

# -- fences riding a write (SQLite) --------------------------------------------------------------
#
# A fence that does not renew can ride the write a commit makes anyway: the write applies only
# if the lease still carries the run's token (its session id and token come last). SQLite holds
# the database's write lock from BEGIN IMMEDIATE (or the autocommit statement) to the commit, so
# nobody can take the lease over between this check and the commit. Not for PostgreSQL: there a
# subquery reads a snapshot and locks nothing, and a take-over could commit in between.
LEASE_HELD = "EXISTS (SELECT 1 FROM leases WHERE session_id = ? AND token = ? AND expires_at > 0)"
INSERT_EFFECT_FENCED = (
    f"INSERT INTO effects ({EFFECT_COLUMNS}) "
    f"SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE {LEASE_HELD} "
    "ON CONFLICT (session_id, tool_use_id) DO NOTHING"
)
UPDATE_EFFECT_FENCED = f"{UPDATE_EFFECT} AND {LEASE_HELD}"
UPDATE_EFFECT_AT_FENCED = f"{UPDATE_EFFECT_AT} AND {LEASE_HELD}"
UPDATE_EFFECT_BY_FENCED = f"{UPDATE_EFFECT_BY} AND {LEASE_HELD}"


# -- a session's counters in its latest message (SQLite) -----------------------------------------
#
# A checkpoint that only moves a session's counters (``PutSession.counters_only``) appends its
# message with the session's new version, turns and tokens in the message's row, and leaves the
# session's row as it was: the row lags behind its transcript. Reads overlay the row with its
# latest such message (``SELECT_SESSION_NOW``), and every compare-and-set on the session's
# version compares the version as it stands (``_version_now``). A write of the session's row writes
# every counter whole, with a version past every message's (a session's version only grows), so
# the row is current again after it. The message's insert is the compare-and-set the session's
# update would have been — only if its seq is the transcript's next and the session is at the
# version expected — and goes in only if the row then lags behind it and nothing but the
# counters moves; a checkpoint that is not so writes the row. SQLite's write lock serialises
# every writer of the file, so a check and the write it guards are one step. Not for
# PostgreSQL: a subquery there reads a snapshot and locks no row, and two writers of one session
# would not meet — its checkpoints update the session's row, which never lags.


def _lags(row: str) -> str:
    """The latest message (``t``) that carries the session's counters, when the session's row
    (``row``) lags behind it: past the row's messages and its version. (A message appended
    otherwise after it, in the transaction that then writes the row, leaves it the one to
    compare with; once the row is written, no message is past its version.)"""
    return (
        f"t.session_id = {row}.session_id AND t.seq = (SELECT seq FROM messages "
        f"WHERE session_id = {row}.session_id AND seq >= {row}.messages "
        f"AND version > {row}.version ORDER BY seq DESC LIMIT 1)"
    )


def _version_now(row: str) -> str:
    """The session's version as it stands: that of the message ``row`` lags behind, if any."""
    return f"coalesce((SELECT t.version FROM messages AS t WHERE {_lags(row)}), {row}.version)"


INSERT_COUNTED_MESSAGE = (
    "INSERT INTO messages (session_id, seq, role, content, created_at, version, turns, "
    "input_tokens, output_tokens) SELECT ?, ?, ?, ?, ?, ?, ?, ?, ? FROM sessions AS s "
    "WHERE s.session_id = ? "
    "AND ? = coalesce((SELECT max(seq) + 1 FROM messages WHERE session_id = s.session_id), 0) "
    f"AND ? = {_version_now('s')} "
    "AND ? >= s.messages AND ? > s.version "
    "AND s.status = ? AND s.reason IS ? AND s.created_at = ? AND s.lineage IS ?"
)
"""The message's values and the session's new counters; then the session id, the message's seq,
the version expected; the seq and the new version again, past the row's (so the message is the
one the row lags behind); then the new state's status, reason, ``created_at`` and lineage, which
must be the session's already — only its counters move. A checkpoint that is not so is written
the other way (``writes``)."""
INSERT_COUNTED_MESSAGE_FENCED = f"{INSERT_COUNTED_MESSAGE} AND {LEASE_HELD}"
UPDATE_SESSION_NOW = (
    "UPDATE sessions SET status = ?, reason = ?, version = ?, turns = ?, input_tokens = ?, "
    "output_tokens = ?, messages = ?, created_at = ?, updated_at = ?, lineage = ? "
    f"WHERE session_id = ? AND ? = {_version_now('sessions')}"
)
"""``UPDATE_SESSION`` (the same parameters), compared with the version as it stands."""
UPDATE_SESSION_NOW_FENCED = f"{UPDATE_SESSION_NOW} AND {LEASE_HELD}"
# Before a rewind takes the transcript's tail out: the row made current from the message that
# carries its counters, which the tail may hold. (Nothing a read sees changes.)
FOLD_SESSION = (
    "UPDATE sessions SET (version, turns, input_tokens, output_tokens, messages, "
    "updated_at) = (SELECT t.version, t.turns, t.input_tokens, t.output_tokens, t.seq + 1, "
    f"t.created_at FROM messages AS t WHERE {_lags('sessions')}) "
    f"WHERE session_id = ? AND EXISTS (SELECT 1 FROM messages AS t WHERE {_lags('sessions')})"
)
_SESSION_NOW = (
    "SELECT s.session_id, s.status, s.reason, coalesce(t.version, s.version), "
    "coalesce(t.turns, s.turns), coalesce(t.input_tokens, s.input_tokens), "
    "coalesce(t.output_tokens, s.output_tokens), coalesce(t.seq + 1, s.messages), "
    "s.created_at, coalesce(t.created_at, s.updated_at), s.lineage "
    f"FROM sessions AS s LEFT JOIN messages AS t ON {_lags('s')}"
)
SELECT_SESSION_NOW = f"{_SESSION_NOW} WHERE s.session_id = ?"
SELECT_SESSIONS_NOW = _SESSION_NOW


def fenced_update_statement(op: UpdateEffect) -> str:
    if op.expect_at is None:
        return UPDATE_EFFECT_FENCED
    return UPDATE_EFFECT_AT_FENCED if op.expect_worker is None else UPDATE_EFFECT_BY_FENCED


DROP_LEASE = "UPDATE leases SET expires_at = 0 WHERE session_id = ? AND token = ?"
DROP_LEASE_OF = DROP_LEASE + " AND owner = ?"


# -- removing a session (retention) -------------------------------------------------------------
#
# The guard of DropSession is the WHERE clause of the session's own DELETE. What follows never
# removes a record in progress or a pending request, whatever landed since: their conditions
# skip them (PostgreSQL runs each statement on a fresh snapshot).
_ENDED = ", ".join(f"'{s.value}'" for s in sorted(PRUNABLE))
_NOTHING_PENDING = (
    "NOT EXISTS (SELECT 1 FROM effects WHERE session_id = ? AND status = 'started') "
    "AND NOT EXISTS (SELECT 1 FROM approvals WHERE session_id = ? AND status = 'pending') "
    "AND NOT EXISTS (SELECT 1 FROM leases WHERE session_id = ? AND expires_at > ?)"
)
DROP_SESSION = (
    f"DELETE FROM sessions WHERE session_id = ? AND version = ? AND status IN ({_ENDED}) "
    f"AND {_NOTHING_PENDING}"
)
# (SQLite) The same, compared with the version as it stands: the row may lag behind its
# messages (``INSERT_COUNTED_MESSAGE``).
DROP_SESSION_NOW = DROP_SESSION.replace("AND version = ?", f"AND ? = {_version_now('sessions')}", 1)
# A session with records and no state (run_tool_uses alone): 1 when it may go.
LEDGER_ONLY_DROPPABLE = (
    "SELECT count(*) FROM (SELECT 1) AS one WHERE NOT EXISTS "
    f"(SELECT 1 FROM sessions WHERE session_id = ?) AND {_NOTHING_PENDING}"
)
# What the remover read (``DropSession.records``, ``.last_activity``), appended to the guard when
# it carries them: nothing of the session written since.
SAME_RECORDS = "(SELECT count(*) FROM effects WHERE session_id = ?) = ?"
NOTHING_SINCE = (
    "NOT EXISTS (SELECT 1 FROM effects WHERE session_id = ? AND updated_at > ?) "
    "AND NOT EXISTS (SELECT 1 FROM approvals WHERE session_id = ? "
    "AND coalesce(decided_at, requested_at) > ?)"
)
DELETE_SETTLED_EFFECTS = "DELETE FROM effects WHERE session_id = ? AND status <> 'started'"
# ... and what follows the guard, with ``last_activity``, skips what was stamped after it.
SEEN_EFFECT = " AND updated_at <= ?"
SEEN_APPROVAL = " AND coalesce(decided_at, requested_at) <= ?"
DELETE_MESSAGES = "DELETE FROM messages WHERE session_id = ?"
DELETE_ABANDONED_MESSAGES = "DELETE FROM abandoned_messages WHERE session_id = ?"
DELETE_ABANDONED_BRANCHES = "DELETE FROM abandoned_branches WHERE session_id = ?"
DELETE_DECIDED_APPROVALS = "DELETE FROM approvals WHERE session_id = ? AND status <> 'pending'"
DELETE_FREE_LEASE = "DELETE FROM leases WHERE session_id = ? AND expires_at <= ?"


def format_style(statement: str) -> str:
    """A statement written with ``?`` placeholders in psycopg's ``%s`` style (a literal ``%``
    doubled). For our own constants only: their literals hold no ``?``."""
    return statement.replace("%", "%%").replace("?", "%s")
