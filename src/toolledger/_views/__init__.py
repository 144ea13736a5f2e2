"""What the CLI and the console both show, as data: a store's overview, a session's timeline,
the words for a branch, the time and owner of a record, windows over long sessions, and a
person's result for a settled call. Printing (rich) and serving (HTML) stay in ``cli`` and
``console``; nothing here writes."""
