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
    """Start rows of the windows over ``n`` rows: 0, stride, ... up to the first window that
    reaches row n-1 (a sequence shorter than ``width`` gets one window). Empty for n = 0.
    """
    _check_window(width, stride)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    count = 1 + -(-max(0, n - width) // stride)
    return np.arange(count, dtype=np.int64) * stride


def window_index(n: int, width: int, stride: int) -> np.ndarray:
    """[n_windows, width] row index of every window slot; -1 marks padding."""
    starts = window_starts(n, width, stride)
    index = starts[:, None] + np.arange(width, dtype=np.int64)[None, :]
    index[index >= n] = -1
    return index


def build_windows(
    rows: np.ndarray, width: int, stride: int, pad_row: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Windows [n_windows, width, F] over ``rows`` [n, F] and their index (``window_index``);
    padding slots hold ``pad_row``.
    """
    index = window_index(rows.shape[0], width, stride)
    valid = index >= 0
    windows = np.where(
        valid[..., None], rows[np.where(valid, index, 0)] if rows.shape[0] else pad_row, pad_row
    )
    return windows.astype(rows.dtype, copy=False), index


def aggregate_windows(preds: np.ndarray, index: np.ndarray, n: int) -> np.ndarray:
    """Per-row mean over the windows containing the row: preds [n_windows, width, k] → [n, k].

    Padding slots (index -1) are ignored. Rows in no window get NaN.
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
