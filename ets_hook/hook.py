"""ETSHook: the one object a training script creates. It wires capture -> forecast -> reporters
into the user's loop: it times steps (``capture.step_clock``: phases, ``torch.compile`` time and
its own work taken out), hands each step boundary to the capture window
(``capture.window_runner.WindowRunner``) and the forecaster, and owns the lifecycle and the
fallbacks. Its arguments are checked in ``hook_arguments``.

Lifecycle::

    created ──► steps [0, skip_steps) timed only
            ──► capture window: steps [skip_steps, skip_steps + capture_steps)
                op profiler (+ our CUPTI collector on GPU) enabled once at its start
            ──► window end: profiler/collector stopped, observers removed, decoding handed to a
                background thread (trace → trace estimate → trace file)
            ──► every later step costs a timestamp and an O(1) forecast update
            ──► close(): final prediction/status, every hook removed

Contract: nothing in here may raise into the training loop. Every internal failure is caught,
logged once on ``logging.getLogger("ets_hook")``, and degrades the hook to a passive step timer.
(The one deliberate exception is the deadline guard with ``on_deadline="raise"``.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import weakref
from array import array
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal

import torch

from . import __version__, exits
from .capture.accumulation import UndeclaredAccumulation
from .capture.batch_clock import BatchClock
from .capture.clocks import read_clocks
from .capture.compile_events import CompileWatcher
from .capture.device_timer import CudaStepTimer
from .capture.host_load import HostLoadSampler
from .capture.ops import NativeOpCapture
from .capture.step_clock import StepClock
from .capture.steps import Authority, NoSteps, StepDetector, optimizer_list
from .capture.sysinfo import (
    DISABLE_ENV,
    checked_trace_path,
    distributed_rank,
    hooks_disabled,
    model_device,
    training_state_bytes,
    usable_cpu_count,
)
from .capture.window import (
    DEFAULT_SKIP_STEPS,
    MAX_ADAPTIVE_CAPTURE_STEPS,
    OpCapture,
    RecordShapes,
    WindowState,
    check_window_settings,
)
from .capture.window_runner import WindowRunner
from .distributed.coordinator import (
    DEFAULT_EXCHANGE_TIMEOUT_S,
    RankCoordinator,
    check_exchange_timeout,
    next_hook_number,
)
from .errors import DeadlineExceededError
from .ets.blas import blas_thread_setter, single_threaded_blas
from .forecast.early_stop import EarlyStoppingRule
from .forecast.epochs import (
    EPOCH_START,
    SEED_TO_LATER_START,
    EpochStarts,
    loader_restarts_workers,
)
from .forecast.forecaster import Forecaster, check_time_limit_s
from .forecast.job import (
    CHECKPOINT,
    COMPILE_PHASE,
    EVAL,
    JobModel,
    PhaseCostPrior,
    checkpoint_cost_prior,
    ended_short_note,
    eval_prior_from_loaders,
)
from .forecast.prediction import Prediction
from .forecast.ranks import JobView
from .forecast.stats import StepTimePrior, TraceEstimate
from .forecast.text import format_duration
from .hook_arguments import (
    check_checkpoint_options,
    check_epochs_length,
    check_switches,
    checked_device,
    checked_grad_scaler,
    checked_timeout_s,
    plain_number,
    warn_if_deadline_past,
)
from .launcher import restart_count
from .reporters.base import ReportDispatcher
from .reporters.builder import build_reporters, check_log_every
from .reporters.deadline import DeadlineAction, DeadlineMiss, DeadlinePolicy
from .trace.events import Trace

logger = logging.getLogger("ets_hook")

#: ``ETSHook.close``'s default wait for a running decode, in seconds.
DEFAULT_CLOSE_TIMEOUT_S = 60.0

TraceEstimator = Callable[[Trace], "TraceEstimate | None"]

# hook.step_times_s keeps the first this-many raw step times (8 bytes each); the forecaster keeps
# its own bounded summary for any job length.
MAX_KEPT_STEP_TIMES = 1 << 20

FORWARD_SOURCE = Authority.FORWARD.value

#: Steps during which the hook looks for ``torch.compile`` having been imported after it.
COMPILE_REGISTER_STEPS = 64
#: With no optimizer given, an optimizer first stepping within this many steps is part of the
#: loop's iteration (not a new stage): the steps counted before it are named (one warning).
NEW_OPTIMIZER_NOTE_STEPS = 16
#: Seconds ``close`` waits for a running decode when the interpreter is exiting.
EXIT_DECODE_WAIT_S = 10.0
#: Steps during which the hook looks for autograd's anomaly detection (its steps run 2-4x
#: slower: the early prediction rests on them).
ANOMALY_CHECK_STEPS = 32
#: A hook closed before the job's known end this long after its last step or phase, in the
#: median step's time (and at least ``UNSEEN_STEPS_MIN_S``), may have missed steps: the loop
#: went on with an optimizer it does not watch (one warning).
UNSEEN_STEPS_FACTOR = 20
UNSEEN_STEPS_MIN_S = 1.0

# The live hook of each model: a new hook on the same model replaces it (notebook cell re-runs).
_hook_of_model: weakref.WeakKeyDictionary[torch.nn.Module, weakref.ref[ETSHook]] = (
    weakref.WeakKeyDictionary()
)


#: The local step after which the step detector's module hook goes even when no capture
#: window ran: where the longest adaptive window, after the default skip, would have ended.
BARE_AFTER_STEP = DEFAULT_SKIP_STEPS + MAX_ADAPTIVE_CAPTURE_STEPS


class ETSHook:
    """Capture the first training steps, predict step time and job time, then get out of the way.

    Create it before the training loop, then call ``close()`` (or use it as a context manager).
    Apart from the constructor's validation, ``phase()``'s name check and ``on_deadline="raise"``,
    nothing here raises into the training loop: internal failures are logged once on
    ``logging.getLogger("ets_hook")`` and degrade the hook to a passive step timer.

    Attributes:
        model: the model given.
        total_steps: optimizer steps in the whole job as resolved from the arguments, or None.
        capture_steps, skip_steps, record_shapes: as given.
        trace_path: this rank's trace file (see ``rank_trace_path``), or None.
        steps_completed: training steps completed by this process (local count).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        total_steps: int | None = None,
        capture_steps: int | None = None,
        skip_steps: int | None = None,
        trace_path: str | os.PathLike[str] | None = None,
        *,
        epochs: float | None = None,
        steps_per_epoch: int | None = None,
        dataloader: Any = None,
        grad_accum_steps: int = 1,
        eval_every: int | None = None,
        eval_dataloader: Any = None,
        checkpoint_every: int | None = None,
        checkpoint_files: int = 1,
        checkpoint_in_memory: bool = False,
        phase_every: Mapping[str, int] | None = None,
        final_phases: Collection[str] = (),
        initial_step: int = 0,
        early_stopping: tuple[int, float, str] | EarlyStoppingRule | None = None,
        log_every: int | None = 100,
        verbose: bool = True,
        progress: Any = False,
        status_path: str | os.PathLike[str] | None = None,
        tensorboard_dir: str | os.PathLike[str] | None = None,
        prometheus_port: int | None = None,
        prometheus_textfile: str | os.PathLike[str] | None = None,
        dashboard_ranks: Collection[int] | None = (0,),
        log_ranks: Collection[int] | None = (0,),
        rank_exchange_timeout_s: float | None = DEFAULT_EXCHANGE_TIMEOUT_S,
        on_prediction: Callable[[Prediction], Any] | None = None,
        deadline: float | datetime | Literal[False] | None = None,
        on_deadline: DeadlineAction | Callable[[DeadlineMiss], Any] = "warn",
        deadline_policy: DeadlinePolicy = "confident",
        time_limit_s: float | None = None,
        grad_scaler: Any = None,
        record_shapes: RecordShapes = "first",
        op_capture: OpCapture = "auto",
        capture_kernels: bool | None = None,
        trace_estimator: TraceEstimator | Literal["auto"] | None = "auto",
        device: Any = None,
        decode_in_background: bool = True,
    ) -> None:
        """Validate the arguments, install the step hooks and, with ``skip_steps=0``, start capture.

        A hook still open on the same model is closed first (one log line: notebook re-runs).
        With ``ETS_HOOK_DISABLE=1`` in the environment the arguments are checked, then the hook
        does nothing (``capture_status`` says so).

        Step counts are optimizer steps. Steps are "global" where they include ``initial_step``.

        Args:
            model: the ``nn.Module`` being trained (the root module: its training forwards mark
                steps when nothing else does).
            optimizer: an optimizer or a sequence of them; a training step ends once every one
                has stepped. None: ``hook.step()`` calls, else any optimizer's step, else the
                model's training forward mark steps.
            total_steps: optimizer steps in the whole job, ``initial_step`` included (int >= 1);
                None: unknown (no ETA) unless ``epochs`` gives it. With several sources of the
                length, the earliest end wins.
            capture_steps: steps in the capture window (int >= 0); 0 turns capture off (a pure
                step timer). None (default): adaptive, at most ``MAX_ADAPTIVE_CAPTURE_STEPS``
                (5): with the job's length known, on the native observer on the CPU, the
                window ends once one more step would take the capture's predicted cost (its
                measured ops x per-op costs in the window, and the decode's set-up plus its
                per-op cost, ``NativeOpCapture.decode_costs``) past 1% of the job's predicted
                total, and a job too short for even one step's decode keeps its steps timed
                only (``capture_status`` says so) unless ``trace_path`` asks for the trace
                (then its first step is decoded and written); elsewhere 5 steps.
            skip_steps: steps timed before the window starts (int >= 0); the window is steps
                ``[skip_steps, skip_steps + capture_steps)`` of this process. None (default):
                ``DEFAULT_SKIP_STEPS`` (3: the steps the step-3 prediction rests on run
                without capture), postponed while steps still compile (``torch.compile``):
                the window starts after two compile-free steps in a row, at most
                ``MAX_AUTO_SKIP_STEPS`` steps in.
                Either way a window waits while another hook in this process holds the native
                op observer (``capture.window_runner.MAX_OBSERVER_WAIT_STEPS`` at most).
            trace_path: where to write the captured trace (atomically; its folder must exist, a
                failed write is logged); ``{rank}`` is filled in and under DDP ``.rank<N>`` is
                added (``rank_trace_path``). None: not written.
            epochs: the job's length in epochs (number > 0, may be fractional); needs
                ``steps_per_epoch`` or ``dataloader``.
            steps_per_epoch: optimizer steps per epoch (int >= 1).
            dataloader: the training loader; with ``len()`` (micro-batches per epoch), steps
                per epoch are ``ceil(len(dataloader) / grad_accum_steps)``; an iterable one
                without (an ``IterableDataset``'s) gives none. A ``torch.utils.data.DataLoader``
                with worker processes also has their batch rate timed from its next ``iter()``
                on (its ``collate_fn`` wrapped until ``close``, ``capture.batch_clock``): the
                floor under the predicted step time while prefetched batches hide it.
            grad_accum_steps: micro-batches per optimizer step (int >= 1).
            eval_every: period in steps of the phase named ``"eval"`` (int >= 1); None: learned.
            eval_dataloader: the loader one evaluation runs over (anything with ``len()``):
                until the first evaluation is measured, each is priced at its batches x a
                forward pass (``FORWARD_SHARE`` of a training micro-batch, scaled by the two
                loaders' ``batch_size``), instead of 0 (``expect_phase_cost``); used with a
                known period (``eval_every``): a phase is not projected before it has one.
            checkpoint_every: period in steps of the phase ``"checkpoint"`` (int >= 1); None:
                learned. With it, until the first checkpoint is measured each is priced at
                the model's and optimizers' state (read after the first step) written at
                ``CHECKPOINT_WRITE_BYTES_PER_S`` (``forecast.job.checkpoint_cost_prior``).
            checkpoint_files: files each checkpoint writes the state to (int >= 1; the
                Lightning callback passes 2 for ``ModelCheckpoint(save_last=True)``, its own
                file and ``last.ckpt``): the checkpoint price is per file.
            checkpoint_in_memory: each checkpoint file is serialised into memory before it is
                written (Lightning does; the callback passes True): priced as one more pass
                over the state, at ``CHECKPOINT_SERIALIZE_BYTES_PER_S``.
            phase_every: period in steps of any named phase (int >= 0; 0: one-off).
            final_phases: names of phases your loop runs once more after its last step
                whatever their period (a final evaluation or save): projected as one
                occurrence at the last step. A phase whose period lands on the last step
                needs no entry (the job ends when its loop does, that occurrence included),
                and gains none from one: occurrences at one step count once.
            initial_step: steps already done before this process (resumed jobs; int >= 0).
            early_stopping: ``(patience, min_delta, mode)`` or an ``EarlyStoppingRule``: the
                job stops early by that rule on the metric given to ``report_metric``;
                predictions then carry ``expected_stop_step`` and ``total_range_s``.
            log_every: a log line every N global steps (int >= 1; plus after local steps 1,
                3, 5, at convergence and on moves of 5%); None or 0: no log lines.
            verbose: with no logging configured, show those lines on stderr (tqdm-aware);
                False: only through the application's logging (``reporters.console``).
            progress: True: a tqdm bar of our own; a user's tqdm bar: our ETA in its postfix;
                False or None: no bar.
            status_path: JSON status file for schedulers, rewritten atomically after local
                steps 1, 3 and 5 and at convergence (the log's early lines), then every 5 s,
                and at close; its directory must exist. None: none.
            tensorboard_dir: TensorBoard log directory for ``ets/iteration_s``, ``.../eta_s``,
                ``.../total_s`` scalars (``ets-hook[tensorboard]``; ``{rank}`` filled in).
            prometheus_port, prometheus_textfile: serve Prometheus gauges (``ets_hook_eta_seconds``,
                ...) on this port, or write them to a node-exporter ``*.prom`` textfile
                (``ets-hook[prometheus]``); a port in use logs a warning. At most one.
            dashboard_ranks: ranks whose TensorBoard/Prometheus reporters open anything (default:
                rank 0; None: every rank). Several ranks with one path (no ``{rank}`` in it) or
                one port get one warning at construction naming the option and the fix.
            log_ranks: ranks that write log lines and show ``progress=True``'s bar (default:
                rank 0; None: every rank).
            rank_exchange_timeout_s: in a multi-process job (``torch.distributed`` initialised),
                the ranks exchange their forecasts through the job's store at a few steps
                (``ets_hook.distributed``) so that every rank predicts the job's end; rank 0
                waits this long (seconds > 0) for every rank, on a background thread. None or
                0: no exchange (each rank predicts its own end).
            on_prediction: callable receiving each due ``Prediction`` and the final one at close;
                an exception from it is logged and disables it.
            deadline: seconds from hook creation (> 0) or a datetime (naive = local time; one
                already past gets a warning, and the guard reports the miss at the first step);
                None: the Slurm job's end time when running under Slurm, else none; False: no
                guard.
            on_deadline: on a predicted miss, ``"warn"`` (log a warning), ``"raise"`` (raise
                ``DeadlineExceededError`` into the training loop, once), or a callable taking a
                ``DeadlineMiss``.
            deadline_policy: ``"confident"`` (even the optimistic end of the 95% interval
                misses), ``"likely"`` (the converged point estimate misses) or ``"point"``.
            time_limit_s: a wall-clock limit that ends the job, seconds from hook creation
                (a finite number > 0: the loop stops there, a scheduler kills it, Lightning's
                ``max_time``); the job ends at the earlier of its last step and the limit.
                Predictions carry it (``Prediction.time_limit_s``): the job's only bound while
                its length is unknown, and a predicted total beyond it becomes the limit
                (``Prediction.stopped_by_time_limit``). None: no limit.
            grad_scaler: a ``torch.amp.GradScaler`` (or anything with a callable ``update()``
                that takes attributes): its ``update()`` marks steps, so steps whose optimizer
                step it skipped still count. Its ``update`` is wrapped until ``close()``.
            record_shapes: input shapes in the captured ops: ``"first"`` (default: the first
                window step only, copied to the aligned ops of the others; recording shapes
                costs the observer about half as much again per op), ``"all"`` (every window
                step), ``"none"``.
            op_capture: how ops are captured: ``"auto"`` (the native RecordFunction observer
                when it is built for this torch, building it in the background on first use;
                the torch profiler until then), ``"native"`` (the observer, built now if
                needed: a one-off compile of a few seconds; the profiler if it cannot be
                built), ``"profiler"`` (the torch profiler). ``capture_status`` says which ran.
            capture_kernels: kernel capture through CUPTI; None: on when the device is CUDA.
            trace_estimator: turns the decoded trace into a step-time estimate: ``"auto"`` (the
                shipped model for the device type, else per-op medians; if it cannot be loaded,
                none), None (none: measured steps only), or a callable ``Trace -> TraceEstimate |
                None``. Its failures are logged.
            device: the training device: a device string or ``torch.device`` of a type in
                ``hook_arguments.DEVICE_TYPES`` (cpu, cuda, mps, xpu) that this process has,
                or an int ``N`` (``cuda:N``, as in torch); None: the device of the model's
                first parameter or buffer, else CPU, read now (a model moved to another device
                type later gets one warning at its first training forward).
            decode_in_background: decode the window on a background thread (default); False:
                on the training thread at the window's end (tests, debugging).

        Raises:
            ValueError: naming the argument and its value: an int argument not an int in its
                range (numpy's integers count, bools do not); ``initial_step`` >
                ``total_steps``; ``epochs`` not a finite number > 0 or without steps per epoch;
                ``dataloader`` not iterable, without ``len()`` beside ``epochs`` and no
                ``steps_per_epoch``, or contradicting ``steps_per_epoch``;
                ``eval_dataloader`` without ``len()``; ``checkpoint_files`` not an int >= 1;
                ``checkpoint_in_memory``, ``verbose`` or ``decode_in_background`` not a bool
                (``capture_kernels``: a bool or None); ``time_limit_s`` not a finite number
                > 0; ``log_every`` not None or an int >= 0; ``device`` not a usable device of
                a type in ``DEVICE_TYPES``; ``grad_scaler`` without a callable ``update``; a
                string argument not one of its values (``deadline_policy`` too without a
                deadline); ``model`` not an ``nn.Module``; ``optimizer`` not optimizers;
                ``progress`` not a tqdm bar; ``trace_path`` or ``status_path`` a directory, in
                a missing directory, or (``trace_path``) with ``{...}`` fields other than
                ``{rank}``; a dashboard option (``prometheus_port`` outside 1-65535 or with
                ``prometheus_textfile``, not ``*.prom``, ...).
            ImportError: ``progress=True`` without tqdm; a dashboard option without its package.
        """
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        # numpy's scalars (a length computed with numpy) count as the numbers they are.
        total_steps, capture_steps, skip_steps, steps_per_epoch, grad_accum_steps = map(
            plain_number,
            (total_steps, capture_steps, skip_steps, steps_per_epoch, grad_accum_steps),
        )
        eval_every, checkpoint_every, checkpoint_files, initial_step, log_every = map(
            plain_number, (eval_every, checkpoint_every, checkpoint_files, initial_step, log_every)
        )
        epochs, prometheus_port, rank_exchange_timeout_s, deadline = map(
            plain_number, (epochs, prometheus_port, rank_exchange_timeout_s, deadline)
        )
        time_limit_s = check_time_limit_s(plain_number(time_limit_s))
        if isinstance(phase_every, Mapping):
            phase_every = {name: plain_number(every) for name, every in phase_every.items()}
        check_log_every(log_every, "log_every")
        grad_scaler = checked_grad_scaler(grad_scaler)  # timm's NativeScaler: its GradScaler
        warn_if_deadline_past(deadline)
        given_device = checked_device(plain_number(device))
        auto_skip = skip_steps is None
        skip_steps = DEFAULT_SKIP_STEPS if skip_steps is None else skip_steps
        adaptive_window = capture_steps is None
        capture_steps = MAX_ADAPTIVE_CAPTURE_STEPS if capture_steps is None else capture_steps
        check_window_settings(capture_steps, skip_steps, op_capture, record_shapes)
        check_switches(capture_kernels, decode_in_background)
        optimizers = optimizer_list(optimizer)
        rank, world_size = distributed_rank()
        rank_trace = checked_trace_path(trace_path, rank, world_size)
        disabled = self._disabled = hooks_disabled()
        rule = EarlyStoppingRule.coerce(early_stopping)
        check_checkpoint_options(checkpoint_files, checkpoint_in_memory)
        eval_prior = (
            eval_prior_from_loaders(eval_dataloader, dataloader, grad_accum_steps)
            if eval_dataloader is not None
            else None
        )
        check_epochs_length(epochs, steps_per_epoch, dataloader)
        job = JobModel.from_args(
            total_steps=total_steps,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            dataloader=dataloader,
            grad_accum_steps=grad_accum_steps,
            eval_every=eval_every,
            checkpoint_every=checkpoint_every,
            phase_every=phase_every,
            final_phases=final_phases,
            initial_step=initial_step,
        )
        # Kept to build them again for a rank learned later (_adopt_rank).
        reporter_args: dict[str, Any] = {
            "log_every_n_steps": log_every,
            "verbose": verbose,
            "progress": progress,
            "status_path": status_path,
            "on_prediction": on_prediction,
            "deadline": deadline,
            "on_deadline": on_deadline,
            "deadline_policy": deadline_policy,
            "tensorboard_dir": tensorboard_dir,
            "prometheus_port": prometheus_port,
            "prometheus_textfile": prometheus_textfile,
            "dashboard_ranks": dashboard_ranks,
            "log_ranks": log_ranks,
        }
        reporters = build_reporters(
            **reporter_args, rank=rank, world_size=world_size, warn_shared_dashboards=not disabled
        )
        exchange_timeout_s = check_exchange_timeout(rank_exchange_timeout_s)
        if disabled:
            reporters, capture_steps = [], 0
            logger.debug("disabled by %s; this hook does nothing", DISABLE_ENV)
        previous = _hook_of_model.get(model)
        previous_hook = previous() if previous is not None else None
        if previous_hook is not None and not previous_hook._closed:
            logger.info("a new ETSHook on this model replaces the previous one")
            previous_hook._replaced = True  # no "closed without a step" for a re-run cell
            previous_hook._close(
                DEFAULT_CLOSE_TIMEOUT_S,
                exits.INTERRUPTED if previous_hook._cell_interrupted else exits.CLOSED,
                None,
            )

        self.model = model
        self.total_steps = job.total_steps
        self._total_steps_given = total_steps is not None
        self._scaler_given = grad_scaler is not None
        self._fp16_without_scaler = False  # float16 autocast seen with no grad_scaler given
        self._host_load = HostLoadSampler(include_siblings=world_size > 1) if not disabled else None
        self._epochs = (
            EpochStarts(
                job.steps_per_epoch, job.initial_step, restarts=loader_restarts_workers(dataloader)
            )
            if job.steps_per_epoch is not None and not disabled
            else None
        )
        self.record_shapes = record_shapes
        self._device = (
            given_device if given_device is not None else torch.device(model_device(model))
        )
        self._device_given = given_device is not None
        self.trace_path = rank_trace

        # Steps are timed with perf_counter_ns; the trace's clock is Unix time: one offset.
        self._created_ns = time.perf_counter_ns()
        self._epoch_offset_ns = read_clocks().epoch_offset_ns
        # Step times: phases, compile time and ets-hook's own work taken out (capture.step_clock).
        compiles = None if disabled else CompileWatcher()
        if compiles is not None:
            compiles.ensure_registered()
        self._clock = StepClock(self._created_ns, compiles)
        self._last_compile_step = -1
        self._compile_warmup_end = 0
        self.steps_completed = 0
        self._step_times_s = array("d")
        self._failed_once = False
        # Resolved before training starts: on the decode thread, loading the model (~0.1 s)
        # would hold the GIL against the training loop.
        estimator: TraceEstimator | None = None
        learned_estimator = False  # its decode costs the loop more (NativeOpCapture.decode_costs)
        if capture_steps > 0:  # the trace model's module (~50 ms to import) only when capturing
            from .forecast.trace_estimators import LearnedTraceEstimator, resolve_trace_estimator

            estimator = resolve_trace_estimator(trace_estimator, self._device.type)
            learned_estimator = isinstance(estimator, LearnedTraceEstimator)
        self._closed = False
        # A process forked from the job (a worker that runs the model, a user's fork) inherits
        # this hook: there it does nothing, and closes nothing of the parent's (_guarded, _close;
        # set by exits at the fork: after_fork_in_child).
        self._forked = False
        self._close_lock = threading.RLock()  # a SIGTERM handler may close inside close()
        # A close() from another thread while the profiler path captures: the training thread
        # (the only one that can end that session) finishes closing at its next hook call.
        self._close_pending: tuple[str, str | None] | None = None
        # A framework callback closes the hook at its train-end event: a hook of theirs still
        # open at exit belongs to a run that stopped early (expect_explicit_close).
        self._explicit_close = False
        self._replaced = False  # a new hook on the same model closed this one
        # steps_completed when a notebook cell was interrupted (_cell_interrupted), or None.
        self._interrupted_at_steps: int | None = None

        self._forecaster = Forecaster(
            job,
            start_s=self._created_ns / 1e9,
            wall_start_s=(self._created_ns + self._epoch_offset_ns) / 1e9,
            prior=StepTimePrior.for_device("cuda" if self._device.type == "cuda" else "cpu"),
            reports=ReportDispatcher(reporters),
            rank=rank,
            world_size=world_size,
            time_limit_s=time_limit_s,
        )
        self._forecaster.set_early_stopping(rule)
        self._batch_clocks: list[BatchClock] = []  # attached last (below)
        # The first epoch's start-up before the first training forward (restarting loaders):
        # (seconds, its end on the step clock), read from the workers' clocks then.
        self._first_epoch_wait: tuple[float, float] | None = None
        if eval_prior is not None:
            self._forecaster.set_phase_prior(EVAL, eval_prior)
            if EVAL not in job.phase_periods and not disabled:
                logger.info(
                    "eval_dataloader= prices the evaluations expected, but no period says when: "
                    "pass eval_every= (steps), or none is expected until the first has run"
                )
        # Checkpoints with a known period are priced from the state they write, read once the
        # first optimizer step has created the optimizers' state; expect_phase_cost wins.
        self._optimizers = optimizers
        self._price_checkpoints = bool(job.phase_periods.get(CHECKPOINT))
        self._checkpoint_files = checkpoint_files
        self._checkpoint_in_memory = checkpoint_in_memory
        self._exchange_timeout_s = exchange_timeout_s if not disabled else None
        self._log_ranks = log_ranks
        self._first_exchange_step = skip_steps + capture_steps + 2
        self._ranks = self._rank_coordinator(rank, world_size)
        # A single process so far: torch.distributed may still be initialised after the hook
        # was made (mp.spawn workers): looked for again up to the first exchange's step.
        self._rank_recheck_until = (
            self._first_exchange_step if world_size == 1 and not disabled else 0
        )
        self._trace_path_given = trace_path
        self._reporter_args = reporter_args
        # The capture window: native op observer loading and machine facts gathered now.
        # Likewise numpy's BLAS setter (a scan of the loaded libraries, 1-10 ms, cached): found
        # now, not by the decode thread against the training loop.
        if capture_steps > 0 and not disabled:
            blas_thread_setter()
        # The job's length read from len(dataloader) as one batch a step: undeclared gradient
        # accumulation would make every ETA k times too long (capture.accumulation).
        self._accumulation = (
            UndeclaredAccumulation(job.steps_per_epoch)
            if dataloader is not None
            and steps_per_epoch is None
            and job.grad_accum_steps == 1
            and job.steps_per_epoch is not None
            and not disabled
            else None
        )
        self._hooks_removal_deferred = False
        self._new_optimizer_noted = False
        self._anomaly_noted = False
        self._loader_hint_due = True  # once the window's trace is in: a DataLoader not given?
        # perf_counter ns of the last step or phase end (close looks for steps it missed).
        self._last_activity_ns = time.perf_counter_ns()
        self._window = WindowRunner(
            self._forecaster,
            capture_steps=capture_steps,
            skip_steps=skip_steps,
            auto_skip=auto_skip,
            record_shapes=record_shapes,
            op_capture=op_capture,
            off_note=f"disabled by {DISABLE_ENV}" if disabled else "",
            capture_kernels=capture_kernels,
            device=self._device,
            step_times_s=self._step_times_s,
            steps_completed=lambda: self.steps_completed,
            remove_capture_hooks=self._remove_capture_hooks,
            on_failure=self._fail,
            trace_estimator=estimator,
            trace_path=rank_trace,
            decode_in_background=decode_in_background,
            decode_context=single_threaded_blas,
            on_breakdown=self._ranks.set_breakdown if self._ranks is not None else None,
            model_name=type(model).__name__,
            rank=rank,
            world_size=world_size,
            ets_hook_version=__version__,
            budget_job_steps=(
                job.total_steps - job.initial_step
                if adaptive_window and job.total_steps is not None
                else None
            ),
            budget_may_drop=rank_trace is None,
            decode_cost=NativeOpCapture.decode_costs[learned_estimator],
        )
        self._monitor: str | None = None
        self._cuda_timer: CudaStepTimer | None = None
        if self._device.type == "cuda" and torch.cuda.is_available():
            self._cuda_timer = CudaStepTimer()
            self._cuda_timer.record(0)

        self._detector: StepDetector | NoSteps = (
            NoSteps()
            if disabled
            else StepDetector(
                model,
                optimizers,
                self._guarded(self._on_boundary),
                grad_scaler=grad_scaler,
                on_first_activity=self._guarded(self._on_first_activity),
                on_forward=self._guarded(self._on_forward),
                on_inputs_vary=self._guarded(self._on_inputs_vary),
                forwards_per_step=job.grad_accum_steps,
                on_new_optimizer=self._guarded(self._on_new_optimizer),
                on_first_optimizer_step=self._guarded(self._on_first_optimizer_step),
                on_repeated_optimizer=self._guarded(self._on_repeated_optimizer),
                on_error=self._fail_unless_deadline,
            )
        )
        if not self._detector.sees_forwards and not disabled:
            logger.info(
                "the model is a scripted TorchScript module, which takes no forward hooks: "
                "steps are its optimizers' steps (or hook.step() calls) and step 0 starts "
                "now; autocast and changing batch shapes are not seen"
            )
        if not disabled:
            _hook_of_model[model] = weakref.ref(self)
            exits.register(self)
            # A loader with worker processes: their batch rate is timed from its next iter()
            # on (capture.batch_clock); the forecaster reads it when it builds a prediction.
            # Last, so that a constructor that raised never leaves the loader wrapped.
            self._use_batch_clock(BatchClock.attach(dataloader))
        # Step 0 starts now, not at _created_ns: the constructor's own work (tens of ms for the
        # first hook of a process) is in no step (a training forward restarts it again).
        self._clock.restart(time.perf_counter_ns())
        if self._window.state == WindowState.WAITING and skip_steps == 0:
            self._guarded(self._window.start)()

    # ------------------------------------------------------------------------------------------
    # Public API

    def step(self) -> None:
        """End one training step.

        With ``optimizer`` given it is optional and absorbed (never double-counted), except
        after a training forward with no optimizer step since the previous call (a skipped
        step), which it ends; with ``grad_scaler`` always absorbed; otherwise the first call
        makes ``step()`` what ends steps (``capture.steps``). Ignored inside a phase and after
        ``close()``. Never raises (``DeadlineExceededError`` included: logged).
        """
        try:
            self._detector.explicit_step()
        except Exception as exc:
            self._fail(exc)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Context manager marking non-training work, excluded from step times.

        Steps do not end inside it (forwards, optimizer steps, ``step()`` are ignored); its time
        is recorded under ``name`` and projected over the rest of the job. Nested phases count
        once, under the outermost name. ``begin_phase``/``end_phase``: the same, unpaired.

        Args:
            name: the phase, e.g. ``"eval"`` or ``"checkpoint"`` (non-empty string).

        Raises:
            ValueError: ``name`` is not a non-empty string (raised on entering the block).
        """
        self.begin_phase(name)
        try:
            yield
        finally:
            self.end_phase()

    def begin_phase(self, name: str) -> None:
        """Start a phase (see ``phase``); pair it with ``end_phase``.

        Raises:
            ValueError: ``name`` is not a non-empty string.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"phase name must be a non-empty string, got {name!r}")
        self._clock.begin_phase(name)
        self._detector.in_phase = True

    def end_phase(self) -> None:
        """End the innermost open phase; the outermost one's duration is recorded under its
        name. Ignored when no phase is open. Never raises."""
        ended = self._clock.end_phase()
        if ended is None:  # nested, or none open
            return
        self._detector.in_phase = False
        self._guarded(self._on_phase_end)(*ended)

    def expect_phase_cost(
        self, name: str, *, seconds: float = 0.0, train_steps: float = 0.0, rel_ci: float = 0.5
    ) -> None:
        """Price phase ``name`` before it is first measured: each occurrence expected before
        then costs ``seconds + train_steps x`` the steady step time (95% interval ±``rel_ci``
        of that) in the total and the ETA, instead of 0. Its first measured occurrence
        replaces this. Useful with a known period (``eval_every``, ``phase_every``, ...): a
        phase without one is not projected before it occurs.

        Args:
            name: the phase, e.g. ``"eval"`` (non-empty string).
            seconds: a fixed cost per occurrence, seconds (>= 0).
            train_steps: a cost in steady training steps (>= 0), e.g. an evaluation's batches
                x 1/3 (a forward of a training micro-batch).
            rel_ci: the relative 95% half-width (>= 0).

        Raises:
            ValueError: ``name`` is not a non-empty string, a number is negative or not
                finite, or both costs are 0.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"phase name must be a non-empty string, got {name!r}")
        prior = PhaseCostPrior(
            seconds=plain_number(seconds),
            train_steps=plain_number(train_steps),
            rel_ci=plain_number(rel_ci),
        )
        if name == CHECKPOINT:
            self._price_checkpoints = False
        self._forecaster.set_phase_prior(name, prior)

    def report_metric(self, name: str, value: float) -> None:
        """One evaluation of the metric that early stopping monitors (``early_stopping=``).

        The first name reported is the monitored one; others are ignored. Never raises.
        On the training thread its cost (the stopping forecast's curve fit, ~1-2 ms) is left
        out of the step's time, as the hook's other own work is.

        Args:
            name: the metric's name, e.g. ``"val_loss"``.
            value: its value now (NaN or infinity counts as no improvement).
        """
        started_ns = time.perf_counter_ns()
        try:
            self._monitor = self._monitor or name
            if name == self._monitor:
                self._forecaster.on_metric(value)
        except Exception as exc:
            self._fail(exc)
        finally:
            self._clock.count_own(started_ns)

    def time_dataloader_workers(self, dataloader: Any) -> bool:
        """Time the worker processes of a loader not given as ``dataloader=``: one a framework
        builds (the Lightning callback passes the Trainer's train loader).

        Their batch pace is a floor under the predicted step time while prefetched batches
        hide it (``capture.batch_clock``, ``forecast.input_supply``). Whether the loader starts
        its workers again at each epoch also decides how the first epoch's start-up is seeded
        (with ``steps_per_epoch``), as for a ``dataloader=``.

        Args:
            dataloader: a ``torch.utils.data.DataLoader`` (or an adapter with a
                ``base_dataloader``); timed from its next ``iter()``, or from its first where a
                clock was attached before it (``BatchClock.attach``).

        Several loaders can be timed (Lightning's combined train loaders): a step takes a
        batch from each, so the slowest one's pace is the floor.

        Returns:
            True when its workers are timed from now on; False when the hook is closed or
            disabled, already times this loader, or it cannot be timed (not a
            ``DataLoader``, no worker processes, persistent workers started untimed). Never
            raises.
        """
        if self._closed or hooks_disabled():
            return False
        if BatchClock.attached_to(dataloader) in self._batch_clocks:
            return False
        try:
            if self._epochs is not None and self._forecaster.steps_done == 0:
                restarts = loader_restarts_workers(dataloader)
                if self._batch_clocks:  # a loader timed already: this one only adds restarts
                    restarts = restarts or self._epochs.restarts
                self._epochs.restarts = restarts
        except Exception as exc:  # a loader whose attributes raise: not the loop's problem
            logger.debug("the loader's worker restarts are unknown: %r", exc)
        return self._use_batch_clock(BatchClock.attach(dataloader))

    def _use_batch_clock(self, clock: BatchClock | None) -> bool:
        """Read ``clock`` (if any) for the workers' pace from now on, beside the clocks read
        already; True when there is one."""
        if clock is None or clock in self._batch_clocks:
            return False
        self._batch_clocks.append(clock)
        self._forecaster.set_input_supply(
            [timed.read for timed in self._batch_clocks],
            cores=usable_cpu_count(),
            main_threads=torch.get_num_threads() if self._device.type == "cpu" else 1,
        )
        return True

    @property
    def prediction(self) -> Prediction | None:
        """The current prediction (None before the first step). Cheap; cached between steps.

        On the training thread its cost (a rebuild: ~0.1-0.8 ms in the first steps, 25-300 µs
        later, the machine's and the job's length's) is left out of the step's time, as the
        hook's other own work is, and not projected.
        """
        started_ns = time.perf_counter_ns()
        try:
            return self._forecaster.prediction
        finally:
            self._clock.count_own(started_ns)

    @property
    def step_times_s(self) -> list[float]:
        """Wall time in seconds of each step of this process so far, step 0 first.

        Marked phases are excluded. Only the first ``MAX_KEPT_STEP_TIMES`` steps are kept.
        """
        return self._step_times_s.tolist()

    @property
    def capture_steps(self) -> int:
        """Steps in the capture window: as given, or with ``capture_steps=None`` its most
        (``MAX_ADAPTIVE_CAPTURE_STEPS``) until the adaptive window ends, then its length."""
        return self._window.capture_steps

    @property
    def capture_cost_s(self) -> float | None:
        """The capture's predicted cost to the training loop, seconds (window + decode, from
        the ops it recorded at the observer's per-op costs; what the adaptive window budgets).
        None before a window step was measured, and off the native observer or the CPU."""
        return self._window.predicted_cost_s

    @property
    def skip_steps(self) -> int:
        """Steps timed before the capture window; with ``skip_steps=None``, raised while the
        first steps still compile; raised while another hook's capture holds the op observer."""
        return self._window.skip_steps

    @property
    def job_view(self) -> JobView | None:
        """The job-level view of the last rank exchange (the same object on every rank), or
        None: a single process, no exchange yet, or the last one was skipped."""
        return self._ranks.view if self._ranks is not None else None

    @property
    def trace(self) -> Trace | None:
        """The captured trace once decoding has finished, else None (see ``wait_for_trace``)."""
        return self._window.trace

    def wait_for_trace(self, timeout_s: float | None = None) -> Trace | None:
        """Wait for the decoded trace.

        Returns at once while capture has not ended yet (waiting or capturing) and when it is
        off (``capture_steps=0``, backed off, failed, disabled). Otherwise blocks until decoding
        finishes or fails.

        Args:
            timeout_s: seconds (>= 0) to wait at most; None: no limit.

        Returns:
            The trace, or None (capture not over, failed, off, or the timeout passed).

        Raises:
            ValueError: ``timeout_s`` is not a number >= 0 or None.
        """
        return self._window.wait(checked_timeout_s(timeout_s))

    @property
    def closed(self) -> bool:
        """Whether the hook is closed (``close()``, the ``with`` block's end, or an exit)."""
        return self._closed

    @property
    def capture_status(self) -> str:
        """Where capture stands: ``waiting``, ``capturing``, ``decoding``, ``done`` or ``off``.

        A note follows after ``": "`` when there is one: why it is off or failed, or that the
        window was cut short by ``close()``.
        """
        return self._window.status

    @property
    def created_ns(self) -> int:
        """``time.perf_counter_ns()`` at hook creation: time zero of ``total_s``."""
        return self._created_ns

    @property
    def kernel_capture_status(self) -> str:
        """Kernel capture: ``not requested``, ``on: ...`` or ``off: <reason>``.

        After decoding with kernels, the share of kernels linked to an op is appended.
        """
        return self._window.kernel_status

    def close(self, timeout_s: float | None = DEFAULT_CLOSE_TIMEOUT_S) -> None:
        """Stop capture, remove every hook, wait for decoding, hand out the final prediction.

        A window still open is cut short and decoded (abandoned if none of its steps ended).
        Reporters get their ``on_close`` (final log line, status file marked closed, ...).
        Safe to call twice and from any thread; never raises but for a bad argument. On the
        native path every op callback is gone when it returns. On the profiler path, whose
        session only the thread that started it can end, a call from another thread during
        the window leaves the hooks in place until the training thread's next step boundary
        (or hook call) ends the session and finishes closing; the final
        prediction is handed out then.

        Args:
            timeout_s: seconds (>= 0) to wait at most for the decode thread; after that,
                decoding goes on in the background and ``trace`` may appear later. None: no
                limit.

        Raises:
            ValueError: ``timeout_s`` is not a number >= 0 or None (checked before anything
                is closed; nothing else raises).
        """
        self._close(checked_timeout_s(timeout_s), exits.CLOSED, None)

    def close_at_exit(self, outcome: str, error: str | None) -> None:
        """Close as the interpreter exits (``ets_hook.exits``): a window still open is stopped
        without decoding, a running decode gets ``EXIT_DECODE_WAIT_S``; the status file records
        ``outcome``. Never raises.

        Args:
            outcome: ``"closed"``, ``"interrupted"`` or ``"failed"``.
            error: the exception's type name for ``"failed"``, else None.
        """
        if outcome == exits.CLOSED and self._cell_interrupted:
            outcome = exits.INTERRUPTED  # a kernel shut down after its cell was interrupted
        elif outcome == exits.CLOSED and self._explicit_close:
            outcome = exits.INTERRUPTED
            logger.warning(
                "the process exits before the framework ended training (step %d): "
                "closed as interrupted",
                self.steps_completed,
            )
        self._close_ended(outcome, error, "the process exited")

    def _close_ended(self, outcome: str, error: str | None, why: str) -> None:
        """Close a job that ended before its loop closed the hook (``why``): an open window is
        cut short without decoding."""
        try:
            if self._window.state == WindowState.CAPTURING:
                self._window.abandon(f"window cut short: {why}")
                if self.trace_path is not None:
                    logger.warning(
                        "no trace written to %s: the job ended (%s) inside the "
                        "capture window, after %d steps",
                        self.trace_path,
                        outcome,
                        self.steps_completed,
                    )
        except Exception as exc:
            self._fail(exc)
        self._close(EXIT_DECODE_WAIT_S, outcome, error)

    def after_failed_cell(self, error: str) -> None:
        """A notebook cell raised (``ets_hook.exits``): a capture window still open is
        abandoned (its loop stopped inside it; the observer would otherwise record every op of
        the later cells); the hook goes on timing steps. After a ``KeyboardInterrupt`` with no
        step since, a replacing hook or the kernel's exit closes it as interrupted. Never
        raises.

        Args:
            error: the exception's type name.
        """
        if self._explicit_close:  # the framework's run is over: it raised
            interrupted = error == "KeyboardInterrupt"
            self.close_at_exit(
                exits.INTERRUPTED if interrupted else exits.FAILED, None if interrupted else error
            )
            return
        # The loop was stopped by hand: if no step follows, the job ends interrupted (a new
        # hook replacing this one, or the kernel shutting down, closes it so).
        self._interrupted_at_steps = self.steps_completed if error == "KeyboardInterrupt" else None
        try:
            window = self._window
            if window.state == WindowState.CAPTURING and not window.needs_capture_thread():
                note = f"window abandoned: the notebook cell raised {error} inside it"
                window.abandon(note)
                logger.info("%s; timing steps only", note)
        except Exception as exc:
            self._fail(exc)

    def after_thread_failed(self, thread_ident: int, error: str) -> None:
        """A thread ended with an uncaught exception (``ets_hook.exits``): if it drove this
        hook's steps, the job failed there; close as ``"failed"``. Never raises.

        Args:
            thread_ident: the thread's ``threading.get_ident()``.
            error: the exception's type name.
        """
        if thread_ident == self._clock.training_thread and not self._closed:
            self._close_ended(exits.FAILED, error, f"the training thread died of {error}")

    def after_fork_in_child(self) -> None:
        """This process is a fork of the job's (``ets_hook.exits``): the hook does nothing here
        from now on — no step, no close, no file of the parent's written. Never raises."""
        self._forked = True

    def _close(self, timeout_s: float | None, outcome: str, error: str | None) -> None:
        if self._forked:
            return  # a forked process: the parent's hook, its files and its status
        with self._close_lock:
            if self._closed:
                return
            if self._window.needs_capture_thread():
                self._close_pending = (outcome, error)  # _guarded finishes on the right thread
                return
            self._closed = True
        exits.unregister(self)
        if outcome == exits.CLOSED:
            # Steps marked by training forwards: the last one ends here, not at a next forward.
            self._detector.finish_forward_step()
        if outcome == exits.CLOSED and exits.sigterm_received() and not self.reached_last_step:
            # A graceful stop on SIGTERM (a handler that set a flag, a framework's own): the job
            # was stopped before its end, as a scheduler's preemption stops it.
            outcome = exits.INTERRUPTED
        if (
            self.steps_completed == 0
            and outcome == exits.CLOSED
            # A framework's run may be empty; a hook replaced before training never trained.
            and not (self._disabled or self._explicit_close or self._replaced)
        ):
            if self.reached_last_step:  # resumed at its end (initial_step == total_steps)
                logger.info(
                    "closed with nothing left to run: the job resumed at step %d of %d",
                    self._forecaster.job.initial_step,
                    self._forecaster.job.total_steps,
                )
            elif self._detector.only_parts_called:
                logger.warning(
                    "closed without a single training step: the loop trained a part of the "
                    "model (or called model.forward directly) but never the model itself, "
                    "whose forward marks steps when no optimizer steps: pass optimizer=, or "
                    "call hook.step() once per step"
                )
            elif self._optimizers and self._detector.absorbed_explicit_steps:
                logger.warning(
                    "closed without a single training step: hook.step() was called %d times "
                    "but with optimizer= given a step is an optimizer step (hook.step() only "
                    "counts one the optimizer skipped after a training forward); for an "
                    "inference or evaluation loop create the hook without optimizer= and call "
                    "hook.step() per batch",
                    self._detector.absorbed_explicit_steps,
                )
            else:
                logger.warning(
                    "closed without a single training step: a step ends at an optimizer "
                    "step of a watched optimizer (optimizer=), or at hook.step(); an inference "
                    "or evaluation loop (model.eval(), torch.no_grad()) creates the hook "
                    "without optimizer= and calls hook.step() per batch"
                )
        if (
            outcome == exits.CLOSED
            and self._optimizers
            and self._forecaster.job.total_steps is not None
            and not self.reached_last_step
        ):
            try:
                self._check_unseen_steps()
            except Exception as exc:  # a warning less, never a failed close
                logger.debug("could not check for steps after the last one: %r", exc)
        if (
            outcome == exits.CLOSED
            and self.steps_completed > 0
            and not (self._explicit_close or self._replaced or self.reached_last_step)
        ):
            self._note_ended_short()
        for clock in self._batch_clocks:
            clock.detach()
        if self._ranks is not None:
            self._ranks.close()
        if self._clock.compiles is not None:
            self._clock.compiles.close()
        try:
            window = self._window
            if window.state == WindowState.CAPTURING and window.captured_steps:
                window.finish(truncated=True)
            elif window.state in (WindowState.WAITING, WindowState.CAPTURING):
                # Nothing to decode: the job ended before the window's first step did.
                window.abandon(
                    f"the job ended after {self.steps_completed} steps, before a window step "
                    f"(the window starts at step {window.skip_steps})"
                )
                if self.trace_path is not None:
                    logger.warning(
                        "no trace written to %s: the job ended after %d steps, "
                        "before a capture window step (skip_steps=%d)",
                        self.trace_path,
                        self.steps_completed,
                        window.skip_steps,
                    )
            self._detector.close()
            self._window.join(timeout_s)
        except Exception as exc:
            self._fail(exc)
        finally:
            self._detector.close()
            self._forecaster.close(outcome, error)

    @property
    def _cell_interrupted(self) -> bool:
        """A notebook cell was interrupted (``after_failed_cell``) and no step ended since."""
        return self._interrupted_at_steps == self.steps_completed

    @property
    def reached_last_step(self) -> bool:
        """Whether the job's known length has been run: ``initial_step`` plus the steps
        completed reach ``total_steps`` (False while the length is unknown)."""
        job = self._forecaster.job
        return job.total_steps is not None and (
            job.initial_step + self.steps_completed >= job.total_steps
        )

    def __enter__(self) -> ETSHook:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close as the ``with`` block ends, the way an exception leaving it ends a job
        (``exits.ending_of``): ``"closed"``; ``"interrupted"`` for ``KeyboardInterrupt``;
        ``"failed"`` for another exception (``SystemExit`` and ``GeneratorExit``: ``"closed"``).
        The exception propagates."""
        self._close(60.0, *exits.ending_of(exc_type))

    def expect_explicit_close(self) -> None:
        """Declare that the code driving this hook closes it when the job ends (a framework
        callback's train-end event). Should the process then exit with the hook still open, or
        a notebook cell raise, the run stopped before its end: the hook closes as
        ``"interrupted"`` (``"failed"`` for a cell's exception other than ``KeyboardInterrupt``)
        instead of ``"closed"``."""
        self._explicit_close = True

    # ------------------------------------------------------------------------------------------
    # Step boundaries (training thread)

    def _guarded(self, function: Callable[..., None]) -> Callable[..., None]:
        def call(*args: Any) -> None:
            if self._forked:
                return  # a forked process: the parent's hook
            pending = self._close_pending
            if pending is not None:  # close() came from another thread: finish it here
                self._close_pending = None
                self._close(60.0, *pending)
                return
            try:
                function(*args)
            except Exception as exc:
                self._fail_unless_deadline(exc)

        return call

    def _on_first_activity(self) -> None:
        if self._rank_recheck_until:
            self._recheck_rank()
        if self._clock.compiles is not None:
            self._clock.compiles.ensure_registered()
        if not self._device_given:
            moved = torch.device(model_device(self.model))
            if moved.type != self._device.type:  # model.to(device) after the hook was made
                logger.warning(
                    "the model moved to %s after this ETSHook was created on %s; its "
                    "step timing, priors and trace model stay those of %s: create the hook after "
                    "model.to(device), or pass device=",
                    moved,
                    self._device,
                    self._device.type,
                )
        # Inside the user's forward: autocast, if used, is on now.
        if (
            self._device.type == "cpu"
            and torch.is_autocast_enabled("cpu")
            and torch.get_autocast_dtype("cpu") in (torch.bfloat16, torch.float16)
        ):
            self._forecaster.set_low_precision()
        device_type = self._device.type
        if (
            not self._scaler_given
            and device_type in ("cpu", "cuda")
            and torch.is_autocast_enabled(device_type)
            and torch.get_autocast_dtype(device_type) == torch.float16
        ):
            self._fp16_without_scaler = True  # a GradScaler's skipped steps go unseen
        # Step 0 starts at the first training forward when nothing was timed before it.
        if self.steps_completed == 0 and self._window.state != WindowState.CAPTURING:
            self._note_first_epoch_wait()
            self._clock.restart(time.perf_counter_ns())
            if self._cuda_timer is not None:
                self._cuda_timer = CudaStepTimer()
                self._cuda_timer.record(0)

    def _note_first_epoch_wait(self) -> None:
        """At the first training forward, before step 0's clock starts: how long the loop waited
        for a restarting loader's workers to start and make its first batch (outside every
        step: it seeds the epoch start-up's cost, ``_on_epoch_starts``). Never raises."""
        epochs = self._epochs
        if epochs is None or not epochs.restarts or not epochs.starts_epoch(0):
            return
        try:
            now_ns, now_s = time.perf_counter_ns(), time.monotonic()
            created_s = now_s - (now_ns - self._created_ns) / 1e9  # on time.monotonic()'s clock
            waits = [clock.first_batch_wait_s(now_s, created_s) for clock in self._batch_clocks]
            known = [w for w in waits if w is not None]
            if known:
                self._first_epoch_wait = (max(known), now_ns / 1e9)
        except Exception as exc:  # only the seed's source changes
            logger.debug("the first epoch's start-up was not read: %r", exc)

    def _on_inputs_vary(self) -> None:
        # The batches change shape beyond their batch dimension: steps of different lengths.
        logger.info(
            "the batches change shape from step to step; the step time is predicted "
            "as the mean over steps of every length seen (the trace estimate is left out)"
        )
        self._forecaster.set_variable_steps()

    def _on_boundary(self, source: str) -> None:
        # Timing first, with nothing that can fail: the step count must survive any error below.
        now_ns = time.perf_counter_ns()
        step_index = self.steps_completed
        span = self._clock.end_step(now_ns, register_compiles=step_index < COMPILE_REGISTER_STEPS)
        compile_ns = span.compile_ns
        epoch_start_ns = self._epoch_start_ns(step_index, span.duration_ns)
        duration_ns = span.duration_ns - epoch_start_ns
        if step_index < MAX_KEPT_STEP_TIMES:
            self._step_times_s.append(duration_ns / 1e9)
        self.steps_completed = step_index + 1
        self._last_activity_ns = now_ns
        try:
            if step_index < ANOMALY_CHECK_STEPS and not self._anomaly_noted:
                self._check_anomaly_mode()
            if self._loader_hint_due and self._window.state == WindowState.DONE:
                self._loader_hint_due = False
                self._hint_dataloader()
            if step_index < self._rank_recheck_until:
                self._recheck_rank()
            if compile_ns:
                self._on_compile_step(step_index, compile_ns, now_ns)
            if self._epochs is not None:
                self._on_epoch_starts(step_index, epoch_start_ns, now_ns)
            if step_index == BARE_AFTER_STEP and self._window.state == WindowState.OFF:
                # No window ever ran (capture_steps=0, another profiler...): the module hook
                # goes when a window's would have (it is idempotent after one that ran).
                self._remove_capture_hooks()
            if step_index == 0 and self._price_checkpoints:
                self._price_checkpoints = False
                state_bytes = training_state_bytes(self.model, self._optimizers)
                self._forecaster.set_phase_prior(
                    CHECKPOINT,
                    checkpoint_cost_prior(
                        state_bytes, self._checkpoint_files, in_memory=self._checkpoint_in_memory
                    ),
                )
            if self._host_load is not None:
                load = self._host_load.sample()  # at most once a second
                if load is not None:
                    self._forecaster.set_host_load(load.foreign_cpu, load.steal)
            self._window.on_step(
                step_index,
                span.work_start_ns,
                now_ns,
                self._last_compile_step,
                own_ns=span.own_in_work_ns,
                phase_in_step=span.phase_ns > 0,
            )
            if self._accumulation is not None:
                self._accumulation.on_step(step_index, forward_marked=source == FORWARD_SOURCE)
                if self._accumulation.done:
                    self._accumulation = None
                    if self._hooks_removal_deferred:
                        self._detector.remove_capture_hooks()
            if self._cuda_timer is not None:
                self._cuda_timer.record(step_index + 1)
                for index, device_s in self._cuda_timer.poll():
                    self._forecaster.on_device_step_end(index, device_s)
            if self._ranks is not None:
                self._ranks.on_step(step_index + 1)
        except Exception as exc:
            self._fail(exc)
        try:
            # Last: with on_deadline="raise" this may raise DeadlineExceededError on purpose.
            self._forecaster.on_step_end(
                step_index, duration_ns / 1e9, now_ns / 1e9, own_s=span.own_ns / 1e9
            )
            job = self._forecaster.job
            if job.total_steps is not None and job.initial_step + step_index == job.total_steps:
                # The first step past the job's length: a prediction now, so that the overrun
                # note names this step, not the next one a reporter happens to look at.
                _ = self._forecaster.prediction
        finally:
            self._clock.boundary_done(now_ns)

    def _on_first_optimizer_step(self, forward_steps: int) -> None:
        """With no optimizer given, training forwards marked ``forward_steps`` steps before an
        optimizer first stepped (``capture.steps``): a loop with several forwards per optimizer
        step (undeclared accumulation, two forwards a batch) had each counted as a step, and its
        count runs ahead of the optimizer's for good. Said once (the detector tells once), with
        what to pass; the line is the hook's own time, not the step's."""
        started_ns = time.perf_counter_ns()
        logger.warning(
            "the first optimizer step came %d model forwards in, each counted "
            "as a step until then (no optimizer= given): the step count runs %d ahead of "
            "the optimizer's; pass optimizer= (and grad_accum_steps= for accumulation) to "
            "count optimizer steps",
            forward_steps + 1,
            forward_steps,
        )
        self._clock.count_own(started_ns)

    def _on_repeated_optimizer(self, index: int) -> None:
        """A given optimizer stepped again before every given one had stepped
        (``capture.steps``): said once, with what to pass where another of them skips steps;
        the line is the hook's own time, not the step's."""
        started_ns = time.perf_counter_ns()
        optimizer = self._optimizers[index]
        logger.info(
            "optimizer #%d of optimizer= (%s) stepped again before every given optimizer had "
            "stepped: a step ends once all %d have stepped, so step %d holds several of its "
            "steps. Fine where it steps several times an iteration (a WGAN critic); where "
            "another of them skips iterations (a sparse embedding's optimizer, a GradScaler's "
            "skipped step), pass only the one that steps every iteration as optimizer=, or call "
            "hook.step() once per iteration",
            index,
            type(optimizer).__name__,
            len(self._optimizers),
            self.steps_completed + 1,
        )
        self._clock.count_own(started_ns)

    def _on_new_optimizer(self, steps_before: int) -> None:
        """With no optimizer given, another optimizer first stepped after the ones seen before
        had ended ``steps_before`` steps alone. Early in the job (a GAN's two optimizers, one
        stepping more often), those steps were parts of iterations and the count runs ahead:
        said once, with what to pass (the hook's own time, not the step's). Later, a new
        optimizer is a new stage: nothing to say."""
        if steps_before > NEW_OPTIMIZER_NOTE_STEPS or self._new_optimizer_noted:
            return
        self._new_optimizer_noted = True
        started_ns = time.perf_counter_ns()
        logger.warning(
            "another optimizer first stepped after %d step(s) had ended at the others' steps "
            "alone (no optimizer= given): the step count may run ahead of the loop's "
            "iterations; pass optimizer=[...] with every optimizer to end a step once all have "
            "stepped",
            steps_before,
        )
        self._clock.count_own(started_ns)

    def _rank_coordinator(self, rank: int, world_size: int) -> RankCoordinator | None:
        """The rank exchange of a multi-process job (None: one process, or the exchange off)."""
        if world_size <= 1 or not self._exchange_timeout_s:
            return None
        log_ranks = self._log_ranks
        return RankCoordinator(
            rank,
            world_size,
            namespace=f"restart{restart_count()}/hook{next_hook_number()}",
            timeout_s=self._exchange_timeout_s,
            first_step=self._first_exchange_step,
            current=lambda: self._forecaster.prediction,
            apply=self._forecaster.set_job_view,
            log_here=log_ranks is None or rank in log_ranks,
            start_wall_s=self._forecaster.wall_start_s,
        )

    def _recheck_rank(self) -> None:
        """The hook found a single process at creation: if ``torch.distributed`` has been
        initialised since (``mp.spawn`` workers that create the hook before
        ``init_process_group``), take its rank and world size -- before the first step's end,
        as if known at creation (``_adopt_rank``); later, when reporters have already acted
        as rank 0, one warning naming the fix. A few calls per hook; O(1) each."""
        rank, world_size = distributed_rank()
        if world_size <= 1:
            return
        self._rank_recheck_until = 0
        if self._forecaster.steps_done == 0:
            self._adopt_rank(rank, world_size)
            return
        logger.warning(
            "torch.distributed was initialised after this ETSHook was created "
            "(rank %d of %d), after its first step: it goes on as a single process (no "
            "job-level prediction; every rank logs and writes rank 0's status and trace "
            "files); create the ETSHook after init_process_group",
            rank,
            world_size,
        )

    def _adopt_rank(self, rank: int, world_size: int) -> None:
        """Become rank ``rank`` of ``world_size`` before the first step has ended: nothing that
        depends on the rank has acted yet (no reporter was offered a prediction, the window's
        trace is not decoded, no exchange was due), so its reporters, trace path, predictions
        and rank exchange become what they would have been with the rank known at creation."""
        trace_path = checked_trace_path(self._trace_path_given, rank, world_size)
        reporters = build_reporters(
            **self._reporter_args,
            rank=rank,
            world_size=world_size,
            warn_shared_dashboards=not self._disabled,
        )
        self.trace_path = trace_path
        self._ranks = self._rank_coordinator(rank, world_size)
        self._forecaster.set_rank(rank, world_size, ReportDispatcher(reporters))
        if self._host_load is not None:  # the other ranks on this node are the job's too
            self._host_load = HostLoadSampler(include_siblings=True)
        self._window.set_rank(
            rank,
            world_size,
            trace_path,
            self._ranks.set_breakdown if self._ranks is not None else None,
        )
        logger.info(
            "torch.distributed was initialised after this ETSHook was created: "
            "it runs as rank %d of %d",
            rank,
            world_size,
        )

    def _remove_capture_hooks(self) -> None:
        """The window is over: the step detector's module hook goes, once the accumulation
        check (a few steps' forwards) no longer needs it."""
        if self._accumulation is not None:
            self._hooks_removal_deferred = True
            return
        self._detector.remove_capture_hooks()

    def _on_forward(self) -> None:
        """A training forward while the step detector's module hook is installed."""
        if self._accumulation is not None:
            self._accumulation.on_forward()
        self._window.on_forward()

    def _epoch_start_ns(self, step_index: int, duration_ns: int) -> int:
        """The input pipeline's epoch start-up in this step (``forecast.epochs``), ns; 0 for
        steps that start no epoch or without steps per epoch. Never raises."""
        if self._epochs is None:
            return 0
        try:
            excess_s = self._epochs.excess_s(step_index, duration_ns / 1e9, self._step_times_s)
            return min(max(int(excess_s * 1e9), 0), duration_ns)
        except Exception:
            return 0

    def _on_epoch_starts(self, step_index: int, epoch_start_ns: int, now_ns: int) -> None:
        """An epoch's start-up taken out of this step is a phase; and the first epoch's start-up
        seeds that phase (loaders that restart): at step 0's end where the workers' clocks
        measured the loop's wait for them, else once the job's first steps exist."""
        epochs = self._epochs
        if epochs is None:
            return
        if epoch_start_ns:
            self._forecaster.on_phase_end(EPOCH_START, epoch_start_ns / 1e9, now_ns / 1e9)
        seed: tuple[float, float] | None = None
        later: tuple[float, float] | None = None
        if self._first_epoch_wait is not None:
            # Before the first step (the workers' clocks saw the loop wait for them): that
            # wait, ended where step 0 began; known as soon as step 0 ends. A lower bound on a
            # later epoch's start-up (SEED_TO_LATER_START).
            seed = self._first_epoch_wait if step_index == 0 else None
            later = SEED_TO_LATER_START
        else:
            # The first step's excess, which happened inside the first step: it ends there, not
            # now (counted now, it would be subtracted from the wall time of steps it is not
            # part of).
            seed_s = epochs.seed_s(self._step_times_s)
            if seed_s is not None:
                seed = (seed_s, self._forecaster.first_step_end_s)
        if seed is not None:
            self._forecaster.on_phase_end(
                EPOCH_START, *seed, at_step=epochs.initial_step, first_to_later=later
            )

    def _on_compile_step(self, step_index: int, compile_ns: int, end_ns: int) -> None:
        """Step ``step_index`` compiled: its compile time is a one-off phase; while the job has
        compiled since its start, that step and the next are warm-up (a recompile later in the
        job is only a phase)."""
        self._last_compile_step = step_index
        self._forecaster.on_phase_end(COMPILE_PHASE, compile_ns / 1e9, end_ns / 1e9)
        if step_index <= self._compile_warmup_end + 1:
            self._compile_warmup_end = step_index + 2
            self._forecaster.set_warmup_steps(self._compile_warmup_end)

    def _note_ended_short(self) -> None:
        """Closed before the job's length was run (a plain loop; a framework's own stops are
        its callbacks'): said once (``ended_short_note``)."""
        job = self._forecaster.job
        note = ended_short_note(
            job.initial_step + self.steps_completed,
            job.total_steps,
            job.grad_accum_steps,
            total_given=self._total_steps_given,
        )
        if note is not None and self._fp16_without_scaler:
            note += (
                "; under float16 autocast, optimizer steps a GradScaler skipped (inf "
                "gradients) are not steps unless it is passed as grad_scaler="
            )
        if note is not None:
            logger.info("%s", note)

    def _check_anomaly_mode(self) -> None:
        """Say once when autograd's anomaly detection is on in an early step: its steps run
        2-4x slower, and the early prediction rests on them."""
        if torch.is_anomaly_enabled():
            self._anomaly_noted = True
            logger.warning(
                "autograd anomaly detection is on (torch.autograd.set_detect_anomaly): steps "
                "run several times slower while it is, and the prediction rests on them; once "
                "it is off, about 20 steps pass before the faster steps count"
            )

    def _hint_dataloader(self) -> None:
        """Once the window's trace is in: when its steps iterated a DataLoader and the hook
        knows no epoch length (no ``dataloader=``, ``steps_per_epoch=`` or ``epochs=``), say
        what passing the loader adds (each epoch's start-up projected, workers timed)."""
        trace = self._window.trace
        batches = trace.metadata.get("dataloader_batches", 0) if trace is not None else 0
        if not batches or self._batch_clocks or self._forecaster.job.steps_per_epoch:
            return
        if self._explicit_close:
            return  # a framework's callback made the hook: it passes what the framework knows
        logger.info(
            "the loop iterates a DataLoader that the hook was not given: pass "
            "dataloader=<the loader> (with epochs=, or total_steps=); over several epochs each "
            "epoch's start-up (workers start again unless persistent_workers) is then "
            "projected, and a loader's worker processes are timed"
        )

    def _check_unseen_steps(self) -> None:
        """At close before the job's known end: when the last step or phase ended long before
        (``UNSEEN_STEPS_FACTOR`` median steps), the loop may have gone on with an optimizer
        made after the hook (a new one per stage), whose steps are not counted. One warning.
        Not for a hook replaced by a new one, nor in a notebook when its last step ran in an
        earlier cell: the time since is the user's, between cells."""
        times = self._step_times_s
        if not times or self._explicit_close or self._replaced:
            return
        if exits.cell_started_ns() > self._last_activity_ns:
            return
        recent = sorted(times[-64:])
        median_s = recent[len(recent) // 2]
        quiet_s = (time.perf_counter_ns() - self._last_activity_ns) / 1e9
        if quiet_s < max(UNSEEN_STEPS_FACTOR * median_s, UNSEEN_STEPS_MIN_S):
            return
        job = self._forecaster.job
        logger.warning(
            "closed at step %d of %d, %s after the last step it counted (~%d steps' time): if "
            "the loop went on training with an optimizer made after the hook (a new one per "
            "stage), those steps were not counted; create the hook without optimizer= so that "
            "any optimizer's steps count",
            job.initial_step + self.steps_completed,
            job.total_steps,
            format_duration(quiet_s),
            round(quiet_s / median_s) if median_s > 0 else 0,
        )

    def _on_phase_end(self, name: str, duration_ns: int, compile_ns: int = 0) -> None:
        now_s = time.perf_counter_ns() / 1e9
        self._last_activity_ns = time.perf_counter_ns()
        if compile_ns:  # e.g. the first eval() forward recompiles
            self._forecaster.on_phase_end(COMPILE_PHASE, compile_ns / 1e9, now_s)
        self._forecaster.on_phase_end(name, duration_ns / 1e9, now_s)

    @property
    def _window_ops(self) -> list[int]:
        """Ops recorded in each window step so far (native path on CPU; tests read it)."""
        return self._window.window_ops

    # ------------------------------------------------------------------------------------------
    # Failure handling

    def _fail_unless_deadline(self, exc: Exception) -> None:
        """A failure in the hook's work inside the loop's own calls (a callback, the step
        detector's forward and optimizer hooks): the loop goes on (a step timer, ``_fail``),
        except for ``DeadlineExceededError``, the one failure meant to reach it (raised)."""
        if isinstance(exc, DeadlineExceededError):
            raise exc
        self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """Log once, stop capturing, keep timing steps. Never raises."""
        try:
            if not self._failed_once:
                self._failed_once = True
                logger.warning(
                    "internal error, continuing as a step timer only: %r",
                    exc,
                    exc_info=logger.isEnabledFor(logging.DEBUG),
                )
            self._window.abandon(f"failed: {exc!r}")
        except Exception:
            pass
