"""Branches: a session's history read back (``_history``), forks and rewinds (``_branching``),
what they leave behind (``_left_behind``) and the note that tells the model (``_note``)."""
