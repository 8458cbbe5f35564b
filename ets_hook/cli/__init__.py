"""The ``ets-hook`` command line: ``main`` (info, export, demo, train, evaluate) and its parts."""
