"""toolledger's own proving ground, not part of its API: the kill torture
(``python -m toolledger._harness.torture``, ``make torture``), the concurrency torture
(``python -m toolledger._harness.concurrent_torture``, ``make torture-concurrent``) and the
deterministic simulation (``python -m toolledger._harness.simulation``, ``make simulate``).
``make test`` runs each in a small form. What users test with is ``toolledger.testing``."""
