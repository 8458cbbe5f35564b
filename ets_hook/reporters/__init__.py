"""Where predictions go: one ``Reporter`` base class (``base``), one reporter per module.

Each reporter has a ``ReportSchedule``; ``ReportDispatcher`` offers it a prediction only when due,
so the per-step cost of all reporters together is one comparison on the forecaster's hot path.
An exception in a reporter is logged once and disables that reporter only;
``DeadlineExceededError`` is the one exception that propagates, on purpose.
"""
