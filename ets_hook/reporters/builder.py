"""``build_reporters``: the reporters an ``ETSHook``'s arguments ask for, in dispatch order."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from .base import Reporter
from .callback import CallbackReporter
from .console import SILENT, ensure_console_handler, quiet_below_warning
from .deadline import (
    DeadlineGuard,
    DeadlineMiss,
    check_deadline_settings,
    slurm_deadline,
)
from .log import LogReporter
from .prometheus import PrometheusReporter
from .status_file import StatusFileReporter, status_paths
from .tensorboard import TensorBoardReporter, check_ranks, launcher_rank
from .tqdm import TqdmReporter

if TYPE_CHECKING:
    from ..forecast.prediction import Prediction

logger = logging.getLogger("ets_hook")

# --------------------------------------------------------------------------------------------
# Factory
# --------------------------------------------------------------------------------------------


def check_log_every(every_n_steps: Any, name: str) -> None:
    """A log period: None or 0 (no log lines) or an int >= 1.

    Args:
        every_n_steps: the value.
        name: the argument's name in the message (``log_every`` for ``ETSHook``).

    Raises:
        ValueError: naming ``name`` and the value.
    """
    if every_n_steps is None:
        return
    if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 0:
        raise ValueError(
            f"{name} must be an int >= 1 (a log line every N steps), or 0 or None (no log "
            f"lines), got {every_n_steps!r}"
        )


def _opening_ranks(dashboard_ranks: Collection[int] | None, world_size: int) -> list[int]:
    """The ranks of a job of ``world_size`` processes whose dashboards open anything."""
    if dashboard_ranks is None:
        return list(range(world_size))
    return sorted(r for r in set(dashboard_ranks) if r < world_size)


def shared_dashboards_warning(
    *,
    tensorboard_dir: str | os.PathLike[str] | None,
    prometheus_port: int | None,
    prometheus_textfile: str | os.PathLike[str] | None,
    dashboard_ranks: Collection[int] | None,
    world_size: int,
) -> str | None:
    """The warning for dashboard options that make several ranks open one place.

    With ``dashboard_ranks`` None (every rank) or several ranks of the job, a
    ``tensorboard_dir`` or ``prometheus_textfile`` without ``{rank}`` is one path for all of
    them (the TensorBoard ranks' event files mix in one run; each rank's textfile replaces the
    others'), and one ``prometheus_port`` cannot be served by several ranks of one host (all
    but the first are off).

    Args:
        tensorboard_dir: ``ETSHook``'s option of that name (None: none).
        prometheus_port: likewise.
        prometheus_textfile: likewise.
        dashboard_ranks: ranks that open dashboards (None: every rank); checked already.
        world_size: processes in the job (>= 1).

    Returns:
        One message naming each such option and its fix (``{rank}`` in the path, or
        ``dashboard_ranks`` left at its default, rank 0); None when at most one rank opens
        dashboards or no option is shared.
    """
    openers = len(_opening_ranks(dashboard_ranks, world_size))
    if openers < 2:
        return None
    problems = []
    if tensorboard_dir is not None and "{rank}" not in os.fspath(tensorboard_dir):
        where = os.fspath(tensorboard_dir)
        example = (where.rstrip("/\\") or where) + "/rank{rank}"
        problems.append(
            f"tensorboard_dir={where!r} has no {{rank}}: the ranks' scalars mix in one "
            f"TensorBoard run (one event file per rank); put {{rank}} in it ({example!r})"
        )
    if prometheus_textfile is not None and "{rank}" not in os.fspath(prometheus_textfile):
        name = os.fspath(prometheus_textfile)
        example = name[: -len(".prom")] + ".rank{rank}.prom" if name.endswith(".prom") else name
        problems.append(
            f"prometheus_textfile={name!r} has no {{rank}}: each rank's write replaces the "
            f"others' (node-exporter sees one rank at a time); put {{rank}} in it "
            f"({example!r})"
        )
    if prometheus_port is not None:
        problems.append(
            f"prometheus_port={prometheus_port} is one port: ranks on one host cannot all "
            "serve it (all but the first are off); use prometheus_textfile with {rank} in it "
            "instead"
        )
    if not problems:
        return None
    given = (
        "dashboard_ranks=None (every rank)"
        if dashboard_ranks is None
        else f"dashboard_ranks={sorted(set(dashboard_ranks))}"
    )
    return (
        f"{given} makes {openers} ranks open the same dashboard: {'; '.join(problems)}; or "
        "leave dashboard_ranks at its default (rank 0 only)"
    )


def build_reporters(
    *,
    log_every_n_steps: int | None = 100,
    verbose: bool = True,
    progress: Any = False,
    status_path: str | os.PathLike[str] | None = None,
    status_interval_s: float = 5.0,
    on_prediction: Callable[[Prediction], Any] | None = None,
    deadline: float | datetime | Literal[False] | None = None,
    on_deadline: str | Callable[[DeadlineMiss], Any] = "warn",
    deadline_policy: str = "confident",
    deadline_margin_s: float = 0.0,
    environ: Mapping[str, str] | None = None,
    tensorboard_dir: str | os.PathLike[str] | None = None,
    prometheus_port: int | None = None,
    prometheus_textfile: str | os.PathLike[str] | None = None,
    dashboard_ranks: Collection[int] | None = (0,),
    log_ranks: Collection[int] | None = (0,),
    rank: int | None = None,
    world_size: int = 1,
    configure_logging: bool = True,
    warn_shared_dashboards: bool = True,
) -> list[Reporter]:
    """Build the reporters for the hook's keyword arguments, validating them now.

    Order: log, progress bar, status file, TensorBoard, Prometheus, callback, deadline guard.
    The guard comes last, so the log line and status file are written before it can raise.

    Args:
        log_every_n_steps: ``LogReporter`` period in global steps; None or 0: no log reporter.
        verbose: show the log lines on stderr when the application configured no logging
            (``reporters.console``); False: only through the application's logging.
        progress: False or None: no bar; True: a tqdm bar of our own; else a user's tqdm bar
            (anything with ``set_postfix_str``) to annotate.
        status_path: JSON status file (``StatusFileReporter``); None: none.
        status_interval_s: seconds between status-file rewrites (> 0).
        on_prediction: callable receiving due predictions (``CallbackReporter``); None: none.
        deadline: seconds from hook creation (> 0, finite) or a datetime (naive = local time);
            None: the Slurm job's end time when ``slurm_deadline`` finds one, else no guard;
            False: no guard.
        on_deadline: ``"warn"``, ``"raise"`` or a callable taking a ``DeadlineMiss``; validated
            even when there is no guard.
        deadline_policy: ``"confident"``, ``"likely"`` or ``"point"`` (see ``DeadlineGuard``).
        deadline_margin_s: seconds (>= 0) before the deadline that already count as a miss.
        environ: environment read for the Slurm deadline and, when ``rank`` is None, the
            launcher's rank; None: ``os.environ``.
        tensorboard_dir: TensorBoard log directory (``TensorBoardReporter``; ``{rank}`` is
            filled in); None: none.
        prometheus_port: port of a Prometheus HTTP endpoint (``PrometheusReporter``); None:
            none.
        prometheus_textfile: node-exporter textfile-collector file (``*.prom``, folder must
            exist; ``{rank}`` is filled in); None: none. Not with ``prometheus_port``.
        dashboard_ranks: ranks whose TensorBoard and Prometheus reporters write or serve (ints
            >= 0); None: every rank. The others open nothing.
        log_ranks: ranks that write log lines and show a progress bar of their own
            (``progress=True``; a user's bar is annotated on every rank); None: every rank.
            The other ranks also keep ets-hook's notes below WARNING to themselves
            (``console.quiet_below_warning``). Where any rank but 0 logs, every line begins
            with its rank (``rank 1 · step 3/120 · ...``).
        rank: this process's rank (the hook passes ``distributed_rank()``'s); None: the
            launcher's (``ets_hook.launcher``, read from ``environ``), else 0.
        world_size: processes in the job (>= 1): above 1, ``status_path`` names the job's file
            (rank 0) and every rank writes its own too (``status_file.status_paths``).
        configure_logging: quiet the ranks that do not log and give the log lines a stderr
            handler (``reporters.console``), and warn (once per job: on the lowest rank that
            opens dashboards, unless ``warn_shared_dashboards`` is False) where the
            dashboard options make several ranks open one path or port
            (``shared_dashboards_warning``); False: leave logging alone and warn of
            nothing (to check options before a hook exists: the reporters are built and
            dropped, none opens anything).
        warn_shared_dashboards: give that warning (False: a hook that is disabled, which
            opens nothing and says nothing).

    Returns:
        The reporters, in dispatch order (possibly empty).

    Raises:
        ValueError: a bad value of any argument above (from the reporters' constructors),
            the deadline's settings included when no deadline is in effect.
        ImportError: ``progress=True`` and tqdm is not installed; ``tensorboard_dir`` without
            tensorboardX (or tensorboard); a Prometheus option without prometheus_client.
    """
    reporters: list[Reporter] = []
    check_ranks(dashboard_ranks, "dashboard_ranks")
    loggers = check_ranks(log_ranks, "log_ranks")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise ValueError(f"rank must be an int >= 0 or None, got {rank!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    this_rank = rank if rank is not None else launcher_rank(environ)
    logs_here = loggers is None or this_rank in loggers
    for name, path in (
        ("status_path", status_path),
        ("tensorboard_dir", tensorboard_dir),
        ("prometheus_textfile", prometheus_textfile),
    ):
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise ValueError(f"{name} must be a path or None, got {path!r}")
    check_log_every(log_every_n_steps, "log_every_n_steps")
    if not isinstance(verbose, bool):
        raise ValueError(f"verbose must be True or False, got {verbose!r}")
    if configure_logging:
        quiet_below_warning(not logs_here)  # notes too, not only the ETA lines
    if log_every_n_steps and logs_here:
        # Lines from ranks other than 0 alone name their rank (several may write to one log).
        several = world_size > 1 and (loggers is None or set(loggers) != {0})
        reporters.append(
            LogReporter(every_n_steps=log_every_n_steps, rank=this_rank if several else None)
        )
    if verbose and configure_logging:
        # Without log lines here, warnings still come out as ets-hook's (prefixed).
        ensure_console_handler(
            level=logging.INFO if log_every_n_steps and logs_here else logging.WARNING
        )
    elif configure_logging:
        # verbose=False with no logging configured: nothing at all, warnings included (else
        # Python's last-resort handler prints them bare). A silent handler of ours does it; a
        # later verbose hook lowers its level, and the application's own logging set up later
        # takes over as it does from a writing one.
        ensure_console_handler(level=SILENT)
    if progress is True:
        if logs_here:
            reporters.append(TqdmReporter())
    elif progress is not False and progress is not None:
        reporters.append(TqdmReporter(progress))
    if status_path is not None:
        for path, scope in status_paths(status_path, this_rank, max(world_size, this_rank + 1)):
            reporters.append(
                StatusFileReporter(
                    path,
                    interval_s=status_interval_s,
                    scope=scope,
                    rank=this_rank,
                    world_size=max(world_size, this_rank + 1),
                )
            )
    if tensorboard_dir is not None:
        reporters.append(TensorBoardReporter(tensorboard_dir, ranks=dashboard_ranks, rank=rank))
    if prometheus_port is not None or prometheus_textfile is not None:
        reporters.append(
            PrometheusReporter(
                port=prometheus_port,
                textfile=prometheus_textfile,
                ranks=dashboard_ranks,
                rank=rank,
            )
        )
    if on_prediction is not None:
        reporters.append(CallbackReporter(on_prediction))
    if deadline is None:
        resolved: float | datetime | None = slurm_deadline(environ)
    elif deadline is False:
        resolved = None
    else:
        resolved = deadline
    if resolved is not None:
        reporters.append(
            DeadlineGuard(resolved, on_deadline, policy=deadline_policy, margin_s=deadline_margin_s)
        )
    else:  # checked all the same: a wrong value must not wait for the first Slurm job to fail
        check_deadline_settings(
            on_deadline,
            deadline_policy,
            deadline_margin_s,
            policy_name="deadline_policy",
            margin_name="deadline_margin_s",
        )
    if configure_logging:  # every option is valid by now
        size = max(world_size, this_rank + 1)
        shared = shared_dashboards_warning(
            tensorboard_dir=tensorboard_dir,
            prometheus_port=prometheus_port,
            prometheus_textfile=prometheus_textfile,
            dashboard_ranks=dashboard_ranks,
            world_size=size,
        )
        first = shared is not None and this_rank == _opening_ranks(dashboard_ranks, size)[0]
        if first and warn_shared_dashboards:
            logger.warning(shared)  # once per job: from the first rank that opens them
    return reporters
