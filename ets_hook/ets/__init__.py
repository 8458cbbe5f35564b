"""The ETS method: pure functions over a ``Trace`` (no capture, no native code).

Per-op features (``features``, ``flops``), row selection (``rows``), targets (``targets``),
sliding windows (``windows``), the regressors' numpy inference (``regressors``) and their
training with torch (``training``).
"""
