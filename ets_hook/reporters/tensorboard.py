"""``TensorBoardReporter``: the prediction as TensorBoard scalars (``SummaryWriter.add_scalar``).

Scalars ``ets/iteration_s``, ``ets/iteration_ci_s``, ``ets/eta_s`` and ``ets/total_s`` at global
step ``prediction.step``. The writer is tensorboardX's ``SummaryWriter`` (the
``ets-hook[tensorboard]`` extra), else ``torch.utils.tensorboard``'s when the ``tensorboard``
package is installed. Neither is imported before the first prediction, and a rank not in
``ranks`` imports and opens nothing: several ranks must not write one log directory. Where
several may (``ranks`` None or more than one) into a directory without ``{rank}``, each rank's
event file name ends in ``.rank<N>`` (tensorboardX names files by the second and the host
alone: two ranks of one host starting in the same second would write one file).
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from ..launcher import fill_rank, launcher_rank_and_size
from .base import EARLY_STEPS, Reporter, ReportSchedule

if TYPE_CHECKING:
    from ..forecast.prediction import Prediction

#: The scalars written, as (tag, ``Prediction`` attribute).
SCALARS = (
    ("ets/iteration_s", "iteration_s"),
    ("ets/iteration_ci_s", "iteration_ci_s"),
    ("ets/eta_s", "eta_s"),
    ("ets/total_s", "total_s"),
)

_MISSING = "ets-hook's TensorBoard reporter needs tensorboardX: pip install 'ets-hook[tensorboard]'"


def launcher_rank(environ: Mapping[str, str] | None = None) -> int:
    """This process's rank as the launcher set it (``ets_hook.launcher``: torchrun, Slurm, MPI).

    Reporters do not import ``capture`` (nor torch): ``ETSHook`` passes the rank it got from
    ``distributed_rank()``; this is the fallback when no rank is given.

    Args:
        environ: the environment; None: ``os.environ``.

    Returns:
        The launcher's rank, or 0 when none is set or it is not an int.
    """
    return launcher_rank_and_size(environ)[0]


def check_ranks(ranks: Collection[int] | None, name: str = "ranks") -> frozenset[int] | None:
    """Validate a collection of ranks.

    Args:
        ranks: ints >= 0 (bools refused), or None (every rank).
        name: the argument's name, for the error message.

    Returns:
        The ranks as a frozenset, or None for every rank.

    Raises:
        ValueError: ``ranks`` is not a collection of ints >= 0 (a bare int or a string
            included).
    """
    if ranks is None:
        return None
    if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Collection):
        raise ValueError(f"{name} must be a collection of ranks (ints >= 0) or None, got {ranks!r}")
    if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ranks):
        raise ValueError(f"{name} must hold ints >= 0, got {ranks!r}")
    return frozenset(ranks)


def dashboard_rank(
    ranks: Collection[int] | None, rank: int | None, interval_s: float
) -> tuple[frozenset[int] | None, int, bool, ReportSchedule]:
    """What the dashboard reporters (TensorBoard, Prometheus) share: which ranks report, this
    process's rank, whether it reports, and their schedule (first prediction, the early steps,
    then every ``interval_s``).

    Args:
        ranks: ranks that report (ints >= 0); None: every rank.
        rank: this process's rank; None: ``launcher_rank()``.
        interval_s: seconds (> 0) between reports after the early steps.

    Returns:
        ``(ranks, rank, active, schedule)``.

    Raises:
        ValueError: ``ranks`` not ints >= 0, ``rank`` not an int >= 0, ``interval_s`` not > 0.
    """
    checked = check_ranks(ranks)
    if rank is None:
        rank = launcher_rank()
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an int >= 0, got {rank!r}")
    schedule = ReportSchedule(first_steps=0, interval_s=interval_s, early_steps=EARLY_STEPS)
    return checked, rank, checked is None or rank in checked, schedule


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


class TensorBoardReporter(Reporter):
    """Writes the prediction as TensorBoard scalars at global step ``prediction.step``.

    Schedule: the first prediction, the early local steps (``EARLY_STEPS``: 1, 2, 3, 5, 10, 20,
    50, where the estimate moves most) and then every ``interval_s`` seconds (10 s by default).
    A prediction costs tens to hundreds of µs to build; the estimate changes slowly, and
    TensorBoard keeps ~1000 points per tag anyway, so denser points would cost time and show
    nothing new. Unknown values (None, e.g. the ETA without a job length) and non-finite ones
    are skipped. The writer is flushed after each prediction (so the charts follow the job)
    and flushed at the end; a writer of our own is closed there, a user's is left open.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        *,
        ranks: Collection[int] | None = (0,),
        writer: Any = None,
        interval_s: float | None = 10.0,
        rank: int | None = None,
    ) -> None:
        """Check the arguments and that a writer can be made; opens nothing yet.

        Args:
            log_dir: TensorBoard log directory (created by the writer at the first
                prediction); ``{rank}`` in it is replaced by the rank. Unused with ``writer``.
            ranks: ranks that write (ints >= 0); None: every rank (put ``{rank}`` in
                ``log_dir`` then; without it, or with several ranks given, the event files
                are told apart by a ``.rank<N>`` suffix). Elsewhere the reporter does nothing.
            writer: a ``SummaryWriter`` (anything with ``add_scalar`` and ``flush``) to write
                to instead of one of our own; it is flushed, not closed, at the end.
            interval_s: seconds (> 0) between writes after the early steps; None: early steps
                only.
            rank: this process's rank; None: ``launcher_rank()`` (the ``RANK`` variable).

        Raises:
            ValueError: ``log_dir`` is an existing file, ``ranks`` not ints >= 0,
                ``interval_s`` not > 0, ``rank`` not an int >= 0, or ``writer`` without
                ``add_scalar``.
            ImportError: no ``writer`` and neither tensorboardX nor tensorboard is installed
                (the message names ``pip install 'ets-hook[tensorboard]'``).
        """
        self.ranks, self.rank, self.active, self.schedule = dashboard_rank(ranks, rank, interval_s)
        rank = self.rank
        self.log_dir = fill_rank(log_dir, rank)
        shared = "{rank}" not in os.fspath(log_dir) and (self.ranks is None or len(self.ranks) > 1)
        #: Appended to the event file's name: ``.rank<N>`` where several ranks may write into
        #: ``log_dir`` (no ``{rank}`` in it), else nothing.
        self.filename_suffix = f".rank{rank}" if shared else ""
        if "://" not in self.log_dir and os.path.isfile(self.log_dir):
            raise ValueError(f"tensorboard_dir is a file, not a directory: {self.log_dir}")
        if writer is not None and not callable(getattr(writer, "add_scalar", None)):
            raise ValueError(f"writer must be a SummaryWriter, got {type(writer).__name__}")
        self._own = writer is None
        self._writer = writer
        self._last: tuple[Any, ...] | None = None
        if self._own and not (_has("tensorboardX") or _has("tensorboard")):
            raise ImportError(_MISSING)

    @property
    def writer(self) -> Any:
        """The ``SummaryWriter`` (None before the first prediction, and on inactive ranks)."""
        return self._writer

    def _open(self) -> Any:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            try:
                from torch.utils.tensorboard import SummaryWriter  # type: ignore[no-redef]
            except ImportError as exc:
                raise ImportError(_MISSING) from exc
        return SummaryWriter(self.log_dir, filename_suffix=self.filename_suffix)

    def _write(self, prediction: Prediction) -> None:
        values = [(tag, _finite(getattr(prediction, attr))) for tag, attr in SCALARS]
        key = (prediction.step, *values)
        if key == self._last:
            return
        if self._writer is None:
            self._writer = self._open()
        for tag, value in values:
            if value is not None:
                self._writer.add_scalar(tag, value, prediction.step)
        self._writer.flush()
        self._last = key

    def on_prediction(self, prediction: Prediction) -> None:
        """Write the scalars (the writer is created on the first call); nothing off-rank."""
        if self.active:
            self._write(prediction)

    def on_close(self, prediction: Prediction | None) -> None:
        """Write the final prediction (unless just written), flush; close our own writer."""
        if not self.active:
            return
        if prediction is not None:
            self._write(prediction)
        if self._writer is not None:
            self._writer.flush()
            if self._own:
                self._writer.close()


def _has(module: str) -> bool:
    """Whether ``module`` is installed, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
