"""From step times and the trace to a ``Prediction``: statistics (``stats``), trace-based
estimators, the job's schedule and phases (``job``), and the ``Forecaster`` the hook drives."""
