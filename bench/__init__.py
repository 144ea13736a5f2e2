"""toolledger benchmarks. Run ``python -m bench`` (or ``toolledger bench``); never timed tests."""
