"""Human-readable durations, step times, relative intervals and one-line predictions."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .prediction import Prediction


# --------------------------------------------------------------------------------------------
# Formatting
# --------------------------------------------------------------------------------------------


def format_duration(seconds: float | None) -> str:
    """Format a duration compactly: ``0.04s``, ``4.2s``, ``42s``, ``13m32s``, ``2h05m``, ``3d04h``.

    Args:
        seconds: the duration in seconds; None or NaN for unknown.

    Returns:
        The text, rounded to the precision shown (hundredths of a second below 0.995 s, a
        trailing zero dropped; tenths below 9.95 s); ``0s`` for 0 and for anything that
        rounds to it (below 0.005 s: never ``0.0s``); ``?`` if unknown, ``∞`` if infinite, a
        leading ``-`` for negatives.
    """
    if seconds is None or math.isnan(seconds):
        return "?"
    if seconds < 0:
        text = format_duration(-seconds)
        return text if text == "0s" else "-" + text
    if math.isinf(seconds):
        return "∞"
    if seconds < 0.995:  # a whole job this short (Lightning's fast_dev_run) is not "0.0s"
        return f"{seconds:.2f}".rstrip("0").rstrip(".") + "s"  # 0.00 -> 0s, 0.40 -> 0.4s
    if seconds < 9.95:
        return f"{seconds:.1f}s"
    whole = round(seconds)
    if whole < 3600:
        minutes, secs = divmod(whole, 60)
        return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
    total_minutes = round(seconds / 60)
    if total_minutes < 24 * 60:
        hours, minutes = divmod(total_minutes, 60)
        return f"{hours}h{minutes:02d}m"
    total_hours = round(seconds / 3600)
    days, hours = divmod(total_hours, 24)
    return f"{days}d{hours:02d}h"


def format_step_time(seconds: float) -> str:
    """Format a step time with 3 significant digits: ``0.412 s/step``, ``12.3 ms/step``,
    ``812 µs/step``.

    Args:
        seconds: the step time in seconds (>= 0 expected).

    Returns:
        The text in s, ms or µs; ``? s/step`` if ``seconds`` is not finite.
    """
    if not math.isfinite(seconds):
        return "? s/step"
    if seconds >= 0.0995:
        return f"{_sig3(seconds)} s/step"
    if seconds >= 0.0009995:
        return f"{_sig3(seconds * 1e3)} ms/step"
    return f"{_sig3(seconds * 1e6)} µs/step"


def _sig3(value: float) -> str:
    if value >= 99.95:
        return f"{value:.0f}"
    if value >= 9.995:
        return f"{value:.1f}"
    if value >= 0.9995:
        return f"{value:.2f}"
    return f"{value:.3f}"


def format_relative(rel: float) -> str:
    """Format a relative interval half-width: ``±1.1%``, ``±12%``.

    Args:
        rel: the half-width as a fraction (0.011 = ±1.1%).

    Returns:
        The percentage with one decimal below 9.95%, else none; ``±?`` if ``rel`` is not finite.
    """
    if not math.isfinite(rel):
        return "±?"
    pct = 100.0 * rel
    return f"±{pct:.1f}%" if pct < 9.95 else f"±{pct:.0f}%"


def format_straggler_host(foreign_cpu: float, *, short: bool = False) -> str:
    """What a straggler's busy host means, for the texts that name the straggler.

    Args:
        foreign_cpu: other processes' share of the straggler's host CPU around its capture
            window, 0..1 (``Prediction.straggler_host_foreign_cpu``).
        short: the short form, for one-line summaries.

    Returns:
        ``the host was busy: other processes 70% of its CPU during the capture; this may be
        the host, not the rank``; short: ``its host was busy: other processes 70% of its CPU
        during the capture``.
    """
    busy = f"other processes {100 * foreign_cpu:.0f}% of its CPU during the capture"
    if short:
        return f"its host was busy: {busy}"
    return f"the host was busy: {busy}; this may be the host, not the rank"


def format_prediction(p: Prediction) -> str:
    """Format a prediction as one line.

    Args:
        p: the prediction.

    Returns:
        ``step 30/2000 · 0.412 s/step ±1.1% · ETA 13m32s · total 13m45s``; without ``/2000``
        while the total step count is unknown, and with `` · total unknown`` in place of the
        ETA and total while ``eta_s`` is (`` · total unknown, at most 1h00m (time limit)`` with
        a time limit ahead, `` · total unknown, time limit 1h00m reached`` past it); a total
        cut to the time limit gains `` (capped by the time limit)``; with early stopping
        followed, `` · early stop ~step 1200 · total 8m20s–13m45s`` (`` · early stop at step
        1200`` once the range has closed: the job stopped there); in a multi-process job
        once a rank exchange has given the job's end,
        `` · job of 8 ranks, waits for rank 3`` (``this rank ends last`` on that rank; ETA and
        total are then the job's; where that rank is the straggler and its host was busy
        during its capture, `` (its host was busy: other processes 70% of its CPU during the
        capture)``, ``format_straggler_host``); while other
        work loads the machine (``Prediction.host_busy``),
        `` · host busy: other processes 40% CPU, steal 6%``; when the step time is the
        DataLoader workers' pace (source ``"input"``), `` · input-bound: DataLoader workers``;
        else, when a quarter or more of a captured step waited for its input
        (``Prediction.waits_for_input``), `` · 62% of a step waits for input``.
    """
    steps = f"step {p.step}/{p.total_steps}" if p.total_steps is not None else f"step {p.step}"
    text = f"{steps} · {format_step_time(p.iteration_s)} {format_relative(p.iteration_rel_ci)}"
    if p.eta_s is not None:
        text += f" · ETA {format_duration(p.eta_s)} · total {format_duration(p.total_s)}"
        if p.stopped_by_time_limit:
            text += " (capped by the time limit)"
    elif p.time_limit_s is None:
        text += " · total unknown"
    elif p.elapsed_s < p.time_limit_s:
        text += f" · total unknown, at most {format_duration(p.time_limit_s)} (time limit)"
    else:
        text += f" · total unknown, time limit {format_duration(p.time_limit_s)} reached"
    if p.expected_stop_step is not None and p.total_range_s is not None:
        low, high = p.total_range_s
        if format_duration(low) == format_duration(high):  # the job stopped there: no range
            text += f" · early stop at step {p.expected_stop_step}"
        else:
            text += (
                f" · early stop ~step {p.expected_stop_step}"
                f" · total {format_duration(low)}–{format_duration(high)}"
            )
    if p.input_bound:
        text += " · input-bound: DataLoader workers"
    elif p.waits_for_input and p.data_wait_share is not None:
        text += f" · {100 * p.data_wait_share:.0f}% of a step waits for input"
    if p.world_size > 1 and p.slowest_rank is not None:
        last = (
            "this rank ends last"
            if p.slowest_rank == p.rank
            else f"waits for rank {p.slowest_rank}"
        )
        text += f" · job of {p.world_size} ranks, {last}"
        if p.straggler_host_foreign_cpu is not None and p.straggler_rank == p.slowest_rank:
            text += f" ({format_straggler_host(p.straggler_host_foreign_cpu, short=True)})"
    foreign, steal = p.host_busy_shares
    if foreign is not None or steal is not None:
        parts = [f"other processes {100 * foreign:.0f}% CPU"] if foreign is not None else []
        parts += [f"steal {100 * steal:.0f}%"] if steal is not None else []
        text += " · host busy: " + ", ".join(parts)
    return text
