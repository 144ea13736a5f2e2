"""Both schemas, side by side: SQLite's and PostgreSQL's migrations, entry for entry.

Entry ``i`` of either list brings a store from schema version ``i`` to ``i + 1``; the versions
of the two backends match. Migrations only append (docs/design.md, rule 17): never edit a shipped
entry, add a new one to both lists.
"""

from __future__ import annotations

from ...errors import SchemaVersionError

# -- SQLite ------------------------------------------------------------------------------------

# Append-only: the index + 1 is the schema version (PRAGMA user_version). Never edit a shipped
# entry; add a new one. Each runs in its own transaction together with the version bump.
SQLITE_MIGRATIONS: list[str] = [
    """
    CREATE TABLE effects (
        session_id  TEXT    NOT NULL,
        tool_use_id TEXT    NOT NULL,
        tool        TEXT    NOT NULL,
        input_hash  TEXT    NOT NULL,
        status      TEXT    NOT NULL,
        attempt     INTEGER NOT NULL,
        result      TEXT,
        error       TEXT,
        created_at  REAL    NOT NULL,
        updated_at  REAL    NOT NULL,
        approved_by TEXT,
        worker      TEXT,
        PRIMARY KEY (session_id, tool_use_id)
    ) WITHOUT ROWID;
    """,
    """
    CREATE TABLE sessions (
        session_id    TEXT    NOT NULL PRIMARY KEY,
        status        TEXT    NOT NULL,
        reason        TEXT,
        version       INTEGER NOT NULL,
        turns         INTEGER NOT NULL,
        input_tokens  INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        messages      INTEGER NOT NULL,
        created_at    REAL    NOT NULL,
        updated_at    REAL    NOT NULL
    ) WITHOUT ROWID;
    CREATE TABLE messages (
        session_id TEXT    NOT NULL,
        seq        INTEGER NOT NULL,
        role       TEXT    NOT NULL,
        content    TEXT    NOT NULL,
        created_at REAL    NOT NULL,
        PRIMARY KEY (session_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE approvals (
        session_id   TEXT    NOT NULL,
        tool_use_id  TEXT    NOT NULL,
        tool         TEXT    NOT NULL,
        input_hash   TEXT    NOT NULL,
        input        TEXT    NOT NULL,
        in_doubt     INTEGER NOT NULL,
        reason       TEXT    NOT NULL,
        status       TEXT    NOT NULL,
        requested_at REAL    NOT NULL,
        decided_at   REAL,
        decided_by   TEXT,
        used_at      REAL,
        PRIMARY KEY (session_id, tool_use_id)
    ) WITHOUT ROWID;
    -- Only in-doubt records are indexed: the CLI lists them across every session.
    CREATE INDEX effects_in_doubt ON effects (session_id) WHERE status = 'started';
    """,
    """
    CREATE TABLE leases (
        session_id TEXT    NOT NULL PRIMARY KEY,
        owner      TEXT    NOT NULL,
        token      INTEGER NOT NULL,
        expires_at REAL    NOT NULL
    ) WITHOUT ROWID;
    """,
    # 4: an attempt's owner and end (docs/design.md, rule 12) and the attempts it replaced; the
    # lease holder's process. Rows written before have NULLs: see EffectRecord and Lease.
    """
    ALTER TABLE effects ADD COLUMN holder TEXT;
    ALTER TABLE effects ADD COLUMN lease_token INTEGER;
    ALTER TABLE effects ADD COLUMN deadline REAL;
    ALTER TABLE effects ADD COLUMN history TEXT;
    ALTER TABLE leases ADD COLUMN holder TEXT;
    ALTER TABLE approvals ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0;
    """,
    # 5: branches (toolledger._lineage). A session's lineage as JSON text (NULL: never branched,
    # as every session written before); a rewind's abandoned branches, each a row of its own
    # (it may hold no message) and its messages under the seqs they had.
    """
    ALTER TABLE sessions ADD COLUMN lineage TEXT;
    CREATE TABLE abandoned_branches (
        session_id TEXT    NOT NULL,
        branch     INTEGER NOT NULL,
        from_seq   INTEGER NOT NULL,
        PRIMARY KEY (session_id, branch)
    ) WITHOUT ROWID;
    CREATE TABLE abandoned_messages (
        session_id TEXT    NOT NULL,
        branch     INTEGER NOT NULL,
        seq        INTEGER NOT NULL,
        role       TEXT    NOT NULL,
        content    TEXT    NOT NULL,
        created_at REAL    NOT NULL,
        PRIMARY KEY (session_id, branch, seq)
    ) WITHOUT ROWID;
    """,
    # 6: a lease's renewal count and time to live (toolledger._liveness: a worker that cannot
    # judge a holder by its process table watches the count, never another machine's clock);
    # an attempt's deadline on its machine's boot clock. Rows written before read renewals 0,
    # ttl NULL and boot_deadline NULL: see Lease and EffectRecord.
    """
    ALTER TABLE leases ADD COLUMN renewals INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE leases ADD COLUMN ttl REAL;
    ALTER TABLE effects ADD COLUMN boot_deadline TEXT;
    """,
    # 7: one lineage, one call per id (docs/design.md, rule 19): the session a call was made in
    # (its key is made from it) and, on a branch's copy, the session whose record it stands
    # for. NULL — every row written before — is a call made in its own session.
    """
    ALTER TABLE effects ADD COLUMN made_in TEXT;
    ALTER TABLE effects ADD COLUMN origin TEXT;
    """,
    # 8: the schema version as a row, beside PRAGMA user_version: a write checks it in its own
    # statement, for the cost of reading one row (toolledger.stores.sqlite.CHECKED), so no
    # migration can land between the check and the write. The migration runner writes the row
    # with user_version, in the same transaction, from this version on (``sqlite_versioned``).
    """
    CREATE TABLE schema_version (
        one     INTEGER NOT NULL PRIMARY KEY CHECK (one = 1),
        version INTEGER NOT NULL
    );
    """,
    # 9: a checkpoint that only moves a session's counters (``PutSession.counters_only``)
    # keeps the session's new version, turns and tokens in the row of the message it appends,
    # instead of rewriting the session's row: one statement less a checkpoint. The session's
    # row then lags behind its transcript until the next write that changes anything else
    # folds it in (``statements.FOLD_SESSION``); every read of a session overlays it with its
    # latest message (``statements.SELECT_SESSION_NOW``). Rows written before, and every
    # message written otherwise, hold NULL: nothing to overlay.
    """
    ALTER TABLE messages ADD COLUMN version INTEGER;
    ALTER TABLE messages ADD COLUMN turns INTEGER;
    ALTER TABLE messages ADD COLUMN input_tokens INTEGER;
    ALTER TABLE messages ADD COLUMN output_tokens INTEGER;
    """,
]

SQLITE_VERSION_ROW = 8
"""The SQLite schema version from which the version is also the row of ``schema_version``."""


def sqlite_versioned(version: int) -> list[str]:
    """The statements that record SQLite schema ``version`` once its migration has run: PRAGMA
    user_version and, from ``SQLITE_VERSION_ROW`` on, the ``schema_version`` row. (Our own
    constants only: ``version`` is an int.)"""
    statements = [f"PRAGMA user_version = {int(version)}"]
    if version >= SQLITE_VERSION_ROW:
        statements.append(
            "INSERT INTO schema_version (one, version) VALUES (1, "
            f"{int(version)}) ON CONFLICT (one) DO UPDATE SET version = excluded.version"
        )
    return statements


# -- PostgreSQL --------------------------------------------------------------------------------

# Append-only: POSTGRES_MIGRATIONS[i] brings the schema from version i to i + 1, and the versions
# match the SQLite store's. Never edit a shipped entry; add a new one. Each runs in its own
# transaction together with its row in toolledger_schema.
#
# Ids are COLLATE "C": byte order never changes, whereas an index under a libc collation can be
# silently corrupted by an OS upgrade that changes the collation — and a corrupt primary key could
# let a second "insert-if-absent" through, which is a side effect run twice.
POSTGRES_MIGRATIONS: list[str] = [
    """
    CREATE TABLE effects (
        session_id  TEXT COLLATE "C" NOT NULL,
        tool_use_id TEXT COLLATE "C" NOT NULL,
        tool        TEXT             NOT NULL,
        input_hash  TEXT             NOT NULL,
        status      TEXT             NOT NULL,
        attempt     BIGINT           NOT NULL,
        result      TEXT,
        error       TEXT,
        created_at  DOUBLE PRECISION NOT NULL,
        updated_at  DOUBLE PRECISION NOT NULL,
        approved_by TEXT,
        worker      TEXT,
        PRIMARY KEY (session_id, tool_use_id)
    )
    """,
    """
    CREATE TABLE sessions (
        session_id    TEXT COLLATE "C" NOT NULL PRIMARY KEY,
        status        TEXT             NOT NULL,
        reason        TEXT,
        version       BIGINT           NOT NULL,
        turns         BIGINT           NOT NULL,
        input_tokens  BIGINT           NOT NULL,
        output_tokens BIGINT           NOT NULL,
        messages      BIGINT           NOT NULL,
        created_at    DOUBLE PRECISION NOT NULL,
        updated_at    DOUBLE PRECISION NOT NULL
    );
    CREATE TABLE messages (
        session_id TEXT COLLATE "C" NOT NULL,
        seq        BIGINT           NOT NULL,
        role       TEXT             NOT NULL,
        content    TEXT             NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (session_id, seq)
    );
    CREATE TABLE approvals (
        session_id   TEXT COLLATE "C" NOT NULL,
        tool_use_id  TEXT COLLATE "C" NOT NULL,
        tool         TEXT             NOT NULL,
        input_hash   TEXT             NOT NULL,
        input        TEXT             NOT NULL,
        in_doubt     INTEGER          NOT NULL,
        reason       TEXT             NOT NULL,
        status       TEXT             NOT NULL,
        requested_at DOUBLE PRECISION NOT NULL,
        decided_at   DOUBLE PRECISION,
        decided_by   TEXT,
        used_at      DOUBLE PRECISION,
        PRIMARY KEY (session_id, tool_use_id)
    );
    -- Only in-doubt records are indexed: the CLI lists them across every session.
    CREATE INDEX effects_in_doubt ON effects (session_id) WHERE status = 'started';
    """,
    """
    CREATE TABLE leases (
        session_id TEXT COLLATE "C" NOT NULL PRIMARY KEY,
        owner      TEXT             NOT NULL,
        token      BIGINT           NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL
    )
    """,
    # 4: an attempt's owner and end (docs/design.md, rule 12) and the attempts it replaced; the
    # lease holder's process. Rows written before have NULLs: see EffectRecord and Lease.
    """
    ALTER TABLE effects ADD COLUMN holder TEXT;
    ALTER TABLE effects ADD COLUMN lease_token BIGINT;
    ALTER TABLE effects ADD COLUMN deadline DOUBLE PRECISION;
    ALTER TABLE effects ADD COLUMN history TEXT;
    ALTER TABLE leases ADD COLUMN holder TEXT;
    ALTER TABLE approvals ADD COLUMN attempt BIGINT NOT NULL DEFAULT 0
    """,
    # 5: branches (toolledger._lineage). A session's lineage as JSON text (NULL: never branched,
    # as every session written before); a rewind's abandoned branches, each a row of its own
    # (it may hold no message) and its messages under the seqs they had.
    """
    ALTER TABLE sessions ADD COLUMN lineage TEXT;
    CREATE TABLE abandoned_branches (
        session_id TEXT COLLATE "C" NOT NULL,
        branch     BIGINT           NOT NULL,
        from_seq   BIGINT           NOT NULL,
        PRIMARY KEY (session_id, branch)
    );
    CREATE TABLE abandoned_messages (
        session_id TEXT COLLATE "C" NOT NULL,
        branch     BIGINT           NOT NULL,
        seq        BIGINT           NOT NULL,
        role       TEXT             NOT NULL,
        content    TEXT             NOT NULL,
        created_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (session_id, branch, seq)
    )
    """,
    # 6: a lease's renewal count and time to live; an attempt's deadline on its machine's boot
    # clock (see the SQLite entry).
    """
    ALTER TABLE leases ADD COLUMN renewals BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE leases ADD COLUMN ttl DOUBLE PRECISION;
    ALTER TABLE effects ADD COLUMN boot_deadline TEXT
    """,
    # 7: as SQLite's.
    """
    ALTER TABLE effects ADD COLUMN made_in TEXT COLLATE "C";
    ALTER TABLE effects ADD COLUMN origin TEXT COLLATE "C"
    """,
    # 8: SQLite's schema_version row. PostgreSQL has kept its version as rows of
    # toolledger_schema since 1, written with each migration: nothing to change.
    """
    SELECT 1
    """,
    # 9: SQLite's counters in a message's row. PostgreSQL rewrites the session's row at every
    # checkpoint still: under its row locks, that update is what makes two writers of one
    # session meet (SQLite's write lock serialises every writer of the file). Nothing to change.
    """
    SELECT 1
    """,
]

TABLES = (
    "effects",
    "sessions",
    "messages",
    "approvals",
    "leases",
    "abandoned_branches",
    "abandoned_messages",
)
VERSION = len(SQLITE_MIGRATIONS)
"""The schema version this toolledger writes (both lists have this many entries)."""


def too_new(version: int, url: str) -> SchemaVersionError | None:
    """The error for a store whose schema is newer than this code, if it is."""
    if version <= VERSION:
        return None
    return SchemaVersionError(
        f"{url} was written by a newer toolledger — upgrade: its schema version is {version}, "
        f"and this release knows up to {VERSION}. Nothing more is written to it. (It is not "
        "damaged: do not restore or replace it, which would re-run every call it records.)",
        url=url,
    )
