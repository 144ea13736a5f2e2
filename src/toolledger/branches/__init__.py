"""Branches: forks and rewinds (``_branching``), what they leave behind (``_left_behind``) and
the note that tells the model (``_note``). A branch's lineage is data beside the records
(``toolledger._lineage``); its history is read through the store (``Store.history``,
``Store.branches``: ``toolledger.stores._history``)."""
