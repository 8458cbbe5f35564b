"""``TqdmReporter``: our ETA on a user's tqdm bar (postfix) or on a bar of our own.

tqdm is an optional extra, imported when this reporter is created.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from ..forecast.text import format_duration, format_relative, format_step_time
from .ascii_text import for_stream
from .base import EARLY_STEPS, Reporter, ReportSchedule

if TYPE_CHECKING:
    from ..forecast.prediction import Prediction


class TqdmReporter(Reporter):
    """Shows our prediction on a tqdm bar.

    ``bar=None``: a bar of our own, created at the first prediction (total = the job's steps,
    starting at the current global step), advanced to the current step and closed at the end;
    its right side shows our ETA instead of tqdm's. A user's bar: only its postfix is set
    (``refresh=False``: it redraws on its own schedule) and it is never closed by us. Needs the
    ``tqdm`` extra for a bar of our own: ``pip install 'ets-hook[tqdm]'``.
    """

    BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"

    def __init__(
        self, bar: Any = None, *, interval_s: float = 0.5, desc: str = "train", **tqdm_kwargs: Any
    ) -> None:
        """Check the bar (or that tqdm is importable); nothing is drawn yet.

        Args:
            bar: a user's tqdm bar (anything with ``set_postfix_str``), or None for our own.
            interval_s: seconds (> 0) between updates after the early steps; None: early steps
                only.
            desc: our own bar's description (unused with a user's bar).
            **tqdm_kwargs: passed to ``tqdm(...)`` for our own bar (unused with a user's bar).

        Raises:
            ImportError: ``bar`` is None and tqdm is not installed.
            ValueError: ``bar`` has no callable ``set_postfix_str``, or ``interval_s`` <= 0.
        """
        self.schedule = ReportSchedule(
            first_steps=0, interval_s=interval_s, early_steps=EARLY_STEPS, at_last_step=True
        )
        self._own = bar is None
        self._bar = bar
        self._desc = desc
        self._kwargs = tqdm_kwargs
        if self._own:
            try:
                from tqdm.auto import tqdm  # the notebook widget in Jupyter, else the text bar
            except ImportError as exc:
                raise ImportError(
                    "ets-hook's progress bar needs tqdm: pip install 'ets-hook[tqdm]'"
                ) from exc
            self._factory: Any = tqdm
        elif not callable(getattr(bar, "set_postfix_str", None)):
            raise ValueError(
                f"progress must be True, False, None or a tqdm bar (an object with "
                f"set_postfix_str), got {bar!r}"
            )

    @staticmethod
    def postfix(p: Prediction) -> str:
        """The bar's postfix: ``0.412 s/step ±1.1% · ETA 13m32s``; no ETA while it is unknown,
        ``done`` once no step remains."""
        text = f"{format_step_time(p.iteration_s)} {format_relative(p.iteration_rel_ci)}"
        if p.remaining_steps == 0:
            text += " · done"
        elif p.eta_s is not None:
            text += f" · ETA {format_duration(p.eta_s)}"
        return text

    def _text_for_bar(self, prediction: Prediction) -> str:
        """The postfix as the bar's stream can encode it (``ascii_text``: ``+/-`` for ``±``
        on an ASCII stderr)."""
        return for_stream(self.postfix(prediction), getattr(self._bar, "fp", None) or sys.stderr)

    def on_prediction(self, prediction: Prediction) -> None:
        """Set the postfix; our own bar is also created if needed and moved to the step."""
        if not self._own:
            self._bar.set_postfix_str(self._text_for_bar(prediction), refresh=False)
            return
        if self._bar is None:
            self._bar = self._factory(
                total=prediction.total_steps,
                initial=prediction.step,
                desc=self._desc,
                unit="step",
                bar_format=self.BAR_FORMAT,
                **self._kwargs,
            )
        self._bar.set_postfix_str(self._text_for_bar(prediction), refresh=False)
        self._bar.update(prediction.step - self._bar.n)

    def on_close(self, prediction: Prediction | None) -> None:
        """Show the final prediction (a bar at its last step says ``done``, not a stale ETA);
        close our own bar after moving it to the final step; a user's bar stays open."""
        if self._bar is None:
            return
        if prediction is not None:
            self._bar.set_postfix_str(self._text_for_bar(prediction), refresh=not self._own)
        if self._own:
            if prediction is not None:
                if self._bar.total is None and prediction.total_steps is not None:
                    self._bar.total = prediction.total_steps  # a length learned at the end
                self._bar.update(prediction.step - self._bar.n)
            self._bar.close()
