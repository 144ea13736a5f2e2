"""The engine: the sans-IO core of one call and one turn. ``_runner`` decides a batch of calls
as a generator that yields every piece of I/O (``_requests``) and is told the answers;
``_decide.step`` says, as a pure function of what is known, what to do next with a call;
``_attempt`` runs one; ``_outcomes`` and ``_late`` write what it did, and say what could not be
written; and ``_drivers`` carry the requests out, synchronously or on an event loop (``_io``:
what a run carries). ``_leases`` and ``_background`` keep a run's session lease. See
docs/architecture.md."""
