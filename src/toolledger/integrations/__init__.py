"""Optional integrations with engines and frameworks toolledger's users already run.

Each module needs its own extra (``pip install 'toolledger[dbos]'``); the core imports none of
them.
"""
