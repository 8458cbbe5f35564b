"""Multi-process jobs: what the ranks of one job tell each other (``exchange``)."""
