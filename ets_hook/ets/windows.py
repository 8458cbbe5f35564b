"""ETS sliding windows: ``width`` rows every ``stride`` rows over an iteration's feature rows.

Windows start at row 0 and continue until one reaches the last row; that last window is padded.
Every row lies in at least one window. A row's prediction is the mean over the windows that
contain it; padding rows are never counted (``aggregate_windows``).
"""

from __future__ import annotations

import numpy as np

DEFAULT_WIDTH = 12
DEFAULT_STRIDE = 3


# ---------------------------------------------------------------------------------------------
# sliding windows


def _check_window(width: int, stride: int) -> None:
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    if not 1 <= stride <= width:
        raise ValueError(f"stride must be in [1, width={width}], got {stride}")


def window_starts(n: int, width: int, stride: int) -> np.ndarray:
    """Start rows of the windows over ``n`` rows.

    Args:
        n: number of rows, >= 0.
        width: rows per window, >= 1.
        stride: rows between window starts, in [1, width].

    Returns:
        int64 [n_windows]: 0, stride, ... up to the first window that reaches row n-1 (a
        sequence shorter than ``width`` gets one window). Empty for n = 0.

    Raises:
        ValueError: ``width`` < 1, ``stride`` outside [1, width], or ``n`` < 0.
    """
    _check_window(width, stride)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    count = 1 + -(-max(0, n - width) // stride)
    return np.arange(count, dtype=np.int64) * stride


def window_index(n: int, width: int, stride: int) -> np.ndarray:
    """Row index of every window slot.

    Args:
        n, width, stride: as ``window_starts``.

    Returns:
        int64 [n_windows, width]: the row in each slot; -1 marks padding.

    Raises:
        ValueError: as ``window_starts``.
    """
    starts = window_starts(n, width, stride)
    index = starts[:, None] + np.arange(width, dtype=np.int64)[None, :]
    index[index >= n] = -1
    return index


def build_windows(
    rows: np.ndarray, width: int, stride: int, pad_row: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Cut feature rows into sliding windows.

    Args:
        rows: [n, F] feature rows.
        width, stride: as ``window_starts``.
        pad_row: [F] the row placed in padding slots.

    Returns:
        ``(windows, index)``: windows [n_windows, width, F] in ``rows``' dtype, padding slots
        holding ``pad_row``, and their index (``window_index``).

    Raises:
        ValueError: as ``window_starts``.
    """
    index = window_index(rows.shape[0], width, stride)
    valid = index >= 0
    windows = np.where(
        valid[..., None], rows[np.where(valid, index, 0)] if rows.shape[0] else pad_row, pad_row
    )
    return windows.astype(rows.dtype, copy=False), index


def aggregate_windows(preds: np.ndarray, index: np.ndarray, n: int) -> np.ndarray:
    """Per-row mean over the windows containing the row.

    Args:
        preds: [n_windows, width, k] per-slot predictions.
        index: [n_windows, width] the windows' row index (``window_index``); -1 slots (padding)
            are ignored.
        n: number of rows; ``index`` must not reference rows >= n.

    Returns:
        float64 [n, k]; NaN for rows in no window.

    Raises:
        ValueError: ``preds.shape[:2]`` differs from ``index.shape``.
    """
    if preds.shape[:2] != index.shape:
        raise ValueError(f"preds {preds.shape} do not match the window index {index.shape}")
    k = preds.shape[2]
    flat = index.ravel()
    valid = flat >= 0
    rows = flat[valid]
    values = preds.reshape(-1, k)[valid]
    counts = np.bincount(rows, minlength=n).astype(np.float64)
    sums = np.stack([np.bincount(rows, weights=values[:, j], minlength=n) for j in range(k)], 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums / counts[:, None]
