"""What runs inside the training process during the capture window.

``steps`` finds step boundaries, ``compile_events`` hears ``torch.compile``'s compiles, ``ops``
records operator events, ``cupti`` (the only importer of the native ``_C``) collects GPU activity
that ``gpu_records`` decodes, ``device_timer`` times steps on the GPU, ``sysinfo`` describes the
host and device. ``window_runner`` runs the capture window (when capture starts and ends, the
decode thread) and ``window`` does its mechanics (which capture runs, building the trace).
"""
