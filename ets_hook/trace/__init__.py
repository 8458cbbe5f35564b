"""The execution trace as data: the model (``events``), its ``.ets`` file format (``io``), the
decoder from raw events (``decode``), importers, Chrome/Perfetto export and the ``info`` summary.

Nothing here imports another stage of ets-hook.
"""
