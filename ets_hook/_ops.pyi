"""The operator observer (``csrc/ops_observer.cpp``), compiled against the installed torch into
a cache on first use and loaded by ``ets_hook.capture.native_ops.load()`` as ``ets_hook._ops``.

A RecordFunction callback records each op's start and end into per-thread buffers while it is
registered (``start`` .. ``stop``); ``drain`` hands the records over as raw bytes in the layout
``record_fields`` describes (``RECORD_ITEMSIZE`` bytes a record), the input shapes and dtypes in
a side buffer of int64 words.
"""

from typing import Any

#: The torch version the module was compiled against (``torch.__version__``).
TORCH_VERSION: str
#: Bytes of one op record.
RECORD_ITEMSIZE: int
#: Bytes of one buffer chunk (a thread's buffer grows chunk by chunk).
CHUNK_BYTES: int
#: Input-word markers in the side buffer (anything but a tensor's rank).
INPUT_SCALAR: int
INPUT_TENSOR_LIST: int
INPUT_SCALAR_LIST: int
INPUT_OTHER: int

def start(with_inputs: bool, thread_budget_bytes: int, correlation: Any = None, /) -> None:
    """Register the callback (forgetting older records); ``correlation``: the CUPTI
    external-correlation capsule of ``ets_hook._C``, or None."""

def set_inputs(with_inputs: bool, /) -> None:
    """Record input shapes and dtypes from now on, or stop recording them."""

def stop() -> None:
    """Remove the callback."""

def registered() -> bool:
    """Whether our callback is registered."""

def has_global_callbacks() -> bool:
    """Whether any global RecordFunction callback is registered (ours or another's)."""

def drain() -> list[tuple[int, bytes, bytes]]:
    """Per recording thread: ``(os_tid, events, inputs)``, the records and input words."""

def dropped() -> int:
    """Records dropped since ``reset()`` (a thread over its budget)."""

def reset() -> int:
    """Free the buffers (only with the callback removed); the bytes freed."""

def allocated_bytes() -> int:
    """Buffer bytes held."""

def record_count() -> int:
    """Records published so far."""

def names(start: int = 0, /) -> list[str]:
    """Interned op names from id ``start`` on."""

def dtype_names() -> list[str]:
    """The name of each ScalarType code."""

def record_fields() -> list[tuple[str, str, int]]:
    """The record layout: ``(name, numpy format, byte offset)`` per field."""
