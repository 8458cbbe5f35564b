"""Job model: how many training steps the job has, and the non-training phases that recur in it.

A *training step* is one optimizer step: with gradient accumulation over ``k`` micro-batches, one
step consumes ``k`` micro-batches (``len(dataloader)`` counts micro-batches). Step counts here are
*global* (``initial_step`` counts the steps done before this process, e.g. when resuming), and a
phase "at step s" is one that ended after ``s`` steps had completed, i.e. between steps ``s`` and
``s + 1``. The job ends when its loop does: a phase at ``s == total_steps`` (an evaluation or a
checkpoint after the last step, on its period or in ``JobModel.final_phases``) is part of the
job time; an epoch start there is not (no epoch follows).

``PhaseTracker`` measures phases as they occur and projects them over the rest of the schedule:
expected remaining occurrences x mean cost. The first occurrence of a phase is often slower (eval
data-loader workers start, the first checkpoint creates files, lazy compilation) and is already
in the elapsed time, so once a phase has occurred twice its cost is the mean of the later
occurrences; until then the first prices the next (+-50%), or a range of it where the first
is known to be a lower bound (``PhaseTracker.record``'s ``first_to_later``: the first epoch's
start-up). Periods come from hints (``eval_every=``, ``checkpoint_every=``, ``phase_every=``)
or are inferred from the observed occurrences. Before a hinted phase first occurs its cost is
unknown and counts as 0, unless a ``PhaseCostPrior`` says what one occurrence should cost (e.g.
an evaluation's batches at the forward share of a training step: ``eval_cost_prior``); the
first measured occurrence replaces the prior.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from statistics import median
from types import MappingProxyType
from typing import Any

from .distributions import student_t_quantile
from .epochs import EPOCH_START

EVAL = "eval"
CHECKPOINT = "checkpoint"

# Prior on the occurrence-to-occurrence CV of a phase's cost (pseudo-df, scale), and the
# relative 95% half-width used while only the (often slower) first occurrence is known.
_PHASE_CV_WEIGHT = 2.0
_PHASE_CV_SCALE = 0.25
_SINGLE_OCCURRENCE_REL_CI = 0.5
_SINGLE_OCCURRENCE_RANGE = (1.0 - _SINGLE_OCCURRENCE_REL_CI, 1.0 + _SINGLE_OCCURRENCE_REL_CI)
# Occurrence steps kept per phase for period inference.
_PERIOD_HISTORY = 64

#: The share of a training micro-batch's time its forward pass takes, for phases priced before
#: they are measured: backward costs about twice the forward (two matrix products per forward
#: one), the optimizer a few percent.
FORWARD_SHARE = 1 / 3
#: The relative 95% half-width of an evaluation's cost priced from the forward share: evaluation
#: loops also gather outputs and compute metrics, and a no-grad forward is somewhat cheaper.
EVAL_PRIOR_REL_CI = 0.6
#: One token generated per sequence of an evaluation batch (greedy, with the key/value cache),
#: as a share of that batch's forward pass: a decoding step runs the decoder's ops once for
#: one position, so it costs far more than its share of the forward's tokens. Measured
#: 0.06-0.37 (geometric mean 0.16) on CPU for T5 and BART encoder-decoders of 2-4 layers,
#: width 64-256, batches 8x32 and 16x64 tokens, 32-64 tokens generated.
GENERATED_TOKEN_FORWARD_SHARE = 0.15
#: Beam search over ``k`` beams: each decoding step costs about ``sqrt(k)`` times a greedy
#: one (measured 1.9-2.4x at 4 beams on the same models).
BEAM_COST_EXPONENT = 0.5
#: The relative 95% half-width of an evaluation that generates: the share above varies 2.5x
#: either way between models, and generation may stop early at end-of-sequence tokens.
GENERATE_PRIOR_REL_CI = 1.0
#: A checkpoint priced before it is measured: a fixed cost (files opened, metadata, the
#: framework's own bookkeeping), plus the model's and optimizers' state written at this rate
#: (``torch.save`` into the page cache; measured 0.6-2 GB/s on this project's CPU jobs, a slow
#: network filesystem is far below), ±100%.
CHECKPOINT_FIXED_S = 0.01
CHECKPOINT_WRITE_BYTES_PER_S = 1e9
#: A framework that serialises the state into memory before writing it (Lightning's
#: ``_atomic_save``: ``torch.save`` into a ``BytesIO``, then one write) pays one more pass over
#: the bytes per file, at this rate (``torch.save`` into a ``BytesIO``: 0.83-0.89 GB/s on this
#: project's CPU machine, 16-256 MB).
CHECKPOINT_SERIALIZE_BYTES_PER_S = 0.85e9
CHECKPOINT_PRIOR_REL_CI = 1.0


def _positive_int(name: str, value: Any, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class JobModel:
    """The job's schedule, resolved to optimizer steps. Build it with ``JobModel.from_args``.

    Attributes:
        total_steps: optimizer steps in the whole job (including ``initial_step``), >= 1;
            None when unknown (no ETA then, only the step-time estimate).
        steps_per_epoch: optimizer steps per epoch, >= 1, or None.
        grad_accum_steps: micro-batches per optimizer step, >= 1.
        initial_step: global steps done before this process (resuming), >= 0.
        phase_periods: phase name -> period in steps (0: one-off, never projected); stored as
            a read-only copy.
        final_phases: phases the loop runs once more after its last step whatever their
            period (the Hugging Face Trainer's final save); stored as a frozenset.

    Raises:
        ValueError: at construction, a field is not an int in its range (bools rejected), a
            phase name is not a non-empty string, ``final_phases`` is not a collection of
            them, or ``initial_step`` > ``total_steps``.
    """

    total_steps: int | None = None
    steps_per_epoch: int | None = None
    grad_accum_steps: int = 1
    initial_step: int = 0
    phase_periods: Mapping[str, int] = field(default_factory=dict)
    final_phases: Collection[str] = frozenset()

    def __post_init__(self) -> None:
        if self.total_steps is not None:
            _positive_int("total_steps", self.total_steps)
        if self.steps_per_epoch is not None:
            _positive_int("steps_per_epoch", self.steps_per_epoch)
        _positive_int("grad_accum_steps", self.grad_accum_steps)
        _positive_int("initial_step", self.initial_step, minimum=0)
        if self.total_steps is not None and self.initial_step > self.total_steps:
            raise ValueError(
                f"initial_step ({self.initial_step}) is past the job's end: total_steps is "
                f"{self.total_steps} (a resumed job's total_steps counts the steps done before)"
            )
        for name, period in self.phase_periods.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"phase names must be non-empty strings, got {name!r}")
            _positive_int(f"period of phase {name!r}", period, minimum=0)
        # A read-only copy: the caller's dict cannot change the model afterwards.
        object.__setattr__(self, "phase_periods", MappingProxyType(dict(self.phase_periods)))
        final = self.final_phases
        if (
            isinstance(final, str)
            or not isinstance(final, Collection)
            or not all(isinstance(name, str) and name for name in final)
        ):
            raise ValueError(
                f"final_phases must be a collection of non-empty phase names, e.g. ('eval',), "
                f"got {final!r}"
            )
        object.__setattr__(self, "final_phases", frozenset(final))

    @classmethod
    def from_args(
        cls,
        *,
        total_steps: int | None = None,
        epochs: float | None = None,
        steps_per_epoch: int | None = None,
        batches_per_epoch: int | None = None,
        dataloader: Any = None,
        total_batches: int | None = None,
        grad_accum_steps: int = 1,
        eval_every: int | None = None,
        checkpoint_every: int | None = None,
        phase_every: Mapping[str, int] | None = None,
        final_phases: Collection[str] = (),
        initial_step: int = 0,
    ) -> JobModel:
        """Resolve the user's description of the job to optimizer steps.

        The job length comes from ``total_steps``, ``epochs`` x steps per epoch and
        ``total_batches``; when several are given the job ends at whichever comes first
        (``min``); with none it is unknown.

        Args:
            total_steps: optimizer steps in the whole job (including ``initial_step``), >= 1.
            epochs: epochs in the job, a finite number > 0 (fractions allowed; rounded up to
                whole steps). Needs steps per epoch: ``steps_per_epoch``, or
                ``ceil(batches / grad_accum_steps)`` with ``batches`` from ``batches_per_epoch``
                or ``len(dataloader)`` (micro-batches; a trailing partial accumulation still
                makes an optimizer step, as in Lightning and Hugging Face). Pass
                ``steps_per_epoch`` if your loop drops it.
            steps_per_epoch: optimizer steps per epoch, >= 1.
            batches_per_epoch: micro-batches per epoch, >= 1.
            dataloader: the training loader: its ``len()`` is the micro-batches per epoch; an
                iterable one without ``len()`` (an ``IterableDataset``'s) gives no epoch length.
            total_batches: micro-batches in the whole job, >= 1; ``ceil(/ grad_accum_steps)``.
            grad_accum_steps: micro-batches per optimizer step, >= 1.
            eval_every: period in optimizer steps (>= 1) of the phase named "eval".
            checkpoint_every: the same for the phase named "checkpoint".
            phase_every: the same for any phase name (0: one-off); ``eval_every`` and
                ``checkpoint_every`` override its entries. With steps per epoch known, the
                phase ``"epoch start"`` (``forecast.epochs``) gets them as its period unless
                given here.
            final_phases: phase names the loop runs once more after its last step, whatever
                their period (a final evaluation or save); a collection of strings.
            initial_step: global steps done before this process (resuming), >= 0.

        Returns:
            The job model.

        Raises:
            ValueError: a count is not an int in its range (bools rejected); both
                ``dataloader`` and ``batches_per_epoch`` are given; ``dataloader`` is not
                iterable, or has no ``len()`` with ``epochs`` and no ``steps_per_epoch``;
                ``steps_per_epoch`` contradicts the batches per epoch; ``epochs`` is
                not a finite number > 0 or comes without steps per epoch; a ``phase_every``
                name is empty or not a string; ``final_phases`` is not a collection of
                non-empty strings; ``initial_step`` exceeds the total steps.
        """
        k = _positive_int("grad_accum_steps", grad_accum_steps)
        if dataloader is not None:
            if batches_per_epoch is not None:
                raise ValueError("give batches_per_epoch or dataloader, not both")
            try:
                batches_per_epoch = len(dataloader)
            except TypeError:
                # An iterable loader (an IterableDataset's): no epoch length from it, which
                # only epochs= needs; the hook still times its workers.
                if not hasattr(dataloader, "__iter__"):
                    raise ValueError(
                        f"dataloader must be a data loader (iterable), got "
                        f"{type(dataloader).__name__}"
                    ) from None
                if epochs is not None and steps_per_epoch is None:
                    raise ValueError(
                        f"dataloader has no len() ({type(dataloader).__name__}): epochs= needs "
                        "steps_per_epoch= with it (or total_steps= instead of epochs=)"
                    ) from None
        if batches_per_epoch is not None:
            _positive_int("batches_per_epoch", batches_per_epoch)
            from_batches = math.ceil(batches_per_epoch / k)
            if steps_per_epoch is not None and steps_per_epoch != from_batches:
                raise ValueError(
                    f"steps_per_epoch={steps_per_epoch} contradicts batches_per_epoch="
                    f"{batches_per_epoch} with grad_accum_steps={k} (= {from_batches} steps)"
                )
            steps_per_epoch = from_batches
        if steps_per_epoch is not None:
            _positive_int("steps_per_epoch", steps_per_epoch)
        candidates = []
        if total_steps is not None:
            candidates.append(_positive_int("total_steps", total_steps))
        if total_batches is not None:
            candidates.append(math.ceil(_positive_int("total_batches", total_batches) / k))
        if epochs is not None:
            if isinstance(epochs, bool) or not isinstance(epochs, (int, float)):
                raise ValueError(f"epochs must be a number > 0, got {epochs!r}")
            if not (math.isfinite(epochs) and epochs > 0):
                raise ValueError(f"epochs must be a number > 0, got {epochs!r}")
            if steps_per_epoch is None:
                raise ValueError(
                    "epochs needs steps_per_epoch=, batches_per_epoch= or a dataloader with len()"
                )
            candidates.append(math.ceil(epochs * steps_per_epoch))
        if phase_every is not None and not isinstance(phase_every, Mapping):
            raise ValueError(
                f"phase_every must be a mapping of phase name to period in steps, e.g. "
                f"{{'eval': 100}}, got {phase_every!r}"
            )
        for name, every in (phase_every or {}).items():
            _positive_int(f"phase_every[{name!r}]", every, minimum=0)
        periods: dict[str, int] = dict(phase_every or {})
        if steps_per_epoch is not None:
            periods.setdefault(EPOCH_START, steps_per_epoch)
        for name, every in ((EVAL, eval_every), (CHECKPOINT, checkpoint_every)):
            if every is not None:
                periods[name] = _positive_int(f"{name}_every", every)
        return cls(
            total_steps=min(candidates) if candidates else None,
            steps_per_epoch=steps_per_epoch,
            grad_accum_steps=k,
            initial_step=_positive_int("initial_step", initial_step, minimum=0),
            phase_periods=periods,
            final_phases=final_phases,
        )

    def remaining_steps(self, step: int) -> int | None:
        """Steps left after ``step`` global steps have completed.

        Returns:
            ``max(0, total_steps - step)``; None when ``total_steps`` is unknown.
        """
        return None if self.total_steps is None else max(0, self.total_steps - step)


@dataclass(frozen=True, slots=True)
class PhaseCostPrior:
    """What one occurrence of a phase is expected to cost before it is first measured.

    Attributes:
        seconds: a fixed part, seconds (>= 0).
        train_steps: a part that scales with the job's steady step time, in steady training
            steps (>= 0), e.g. an evaluation of ``n`` batches at a forward's share of a step.
        rel_ci: the relative 95% half-width of the sum (>= 0).

    Raises:
        ValueError: a field is negative, not finite, or both parts are 0.
    """

    seconds: float = 0.0
    train_steps: float = 0.0
    rel_ci: float = 0.5

    def __post_init__(self) -> None:
        for name in ("seconds", "train_steps", "rel_ci"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.seconds == 0 and self.train_steps == 0:
            raise ValueError("a phase cost prior needs seconds > 0 or train_steps > 0")

    def cost_s(self, iteration_s: float) -> float:
        """One occurrence's expected cost, seconds, at a steady step of ``iteration_s``."""
        return self.seconds + self.train_steps * max(iteration_s, 0.0)


def eval_cost_prior(
    batches: int,
    batch_ratio: float = 1.0,
    grad_accum_steps: int = 1,
    *,
    generated_tokens: int = 0,
    num_beams: int = 1,
) -> PhaseCostPrior:
    """The prior cost of one evaluation: its batches, each a forward pass of a training
    micro-batch scaled by the batch-size ratio (``FORWARD_SHARE`` of a micro-batch's time),
    plus, for an evaluation that generates (a ``Seq2SeqTrainer`` with
    ``predict_with_generate``), ``generated_tokens`` decoding steps per batch at
    ``GENERATED_TOKEN_FORWARD_SHARE`` of that forward each (times ``num_beams **
    BEAM_COST_EXPONENT``).

    Args:
        batches: evaluation batches per evaluation, >= 1.
        batch_ratio: evaluation batch size / training micro-batch size, > 0.
        grad_accum_steps: micro-batches per optimizer step, >= 1.
        generated_tokens: tokens generated per sequence of a batch, >= 0 (0: no generation).
        num_beams: beams of the generation's search, >= 1.

    Returns:
        The prior, in steady training steps, with ``EVAL_PRIOR_REL_CI`` (no generation) or
        ``GENERATE_PRIOR_REL_CI``.

    Raises:
        ValueError: an argument out of range.
    """
    _positive_int("batches", batches)
    _positive_int("grad_accum_steps", grad_accum_steps)
    _positive_int("generated_tokens", generated_tokens, minimum=0)
    _positive_int("num_beams", num_beams)
    if not (isinstance(batch_ratio, (int, float)) and math.isfinite(batch_ratio)) or (
        batch_ratio <= 0
    ):
        raise ValueError(f"batch_ratio must be a finite number > 0, got {batch_ratio!r}")
    forwards = 1.0 + generated_tokens * GENERATED_TOKEN_FORWARD_SHARE * (
        num_beams**BEAM_COST_EXPONENT
    )
    steps = batches * batch_ratio * FORWARD_SHARE * forwards / grad_accum_steps
    rel_ci = GENERATE_PRIOR_REL_CI if generated_tokens else EVAL_PRIOR_REL_CI
    return PhaseCostPrior(train_steps=steps, rel_ci=rel_ci)


def checkpoint_cost_prior(
    state_bytes: int, files: int = 1, *, in_memory: bool = False
) -> PhaseCostPrior:
    """The prior cost of one checkpoint: per file it writes, the fixed cost plus
    ``state_bytes`` at ``CHECKPOINT_WRITE_BYTES_PER_S`` (and, serialised into memory first, at
    ``CHECKPOINT_SERIALIZE_BYTES_PER_S`` too); ±``CHECKPOINT_PRIOR_REL_CI``.

    Args:
        state_bytes: bytes one file holds (the model's and optimizers' state), >= 0.
        files: files each save writes, >= 1 (Lightning's ``ModelCheckpoint(save_last=True)``
            writes the state twice: its own file and ``last.ckpt``).
        in_memory: each file's state is serialised into memory before it is written (one
            more pass over the bytes).

    Returns:
        The prior, in seconds.

    Raises:
        ValueError: ``state_bytes`` is negative, ``files`` < 1, or either is not an int.
    """
    _positive_int("state_bytes", state_bytes, minimum=0)
    _positive_int("files", files)
    per_byte_s = 1.0 / CHECKPOINT_WRITE_BYTES_PER_S
    if in_memory:
        per_byte_s += 1.0 / CHECKPOINT_SERIALIZE_BYTES_PER_S
    seconds = files * (CHECKPOINT_FIXED_S + state_bytes * per_byte_s)
    return PhaseCostPrior(seconds=seconds, rel_ci=CHECKPOINT_PRIOR_REL_CI)


def loader_batch_size(loader: Any) -> int | None:
    """A loader's ``batch_size`` when it is an int >= 1 (a ``DataLoader`` with a batch
    sampler), else None.

    Args:
        loader: anything, usually a ``torch.utils.data.DataLoader``.

    Returns:
        The batch size, or None.
    """
    size = getattr(loader, "batch_size", None)
    return size if isinstance(size, int) and size > 0 else None


def eval_prior_from_loaders(
    eval_dataloader: Any, dataloader: Any = None, grad_accum_steps: int = 1
) -> PhaseCostPrior | None:
    """``eval_cost_prior`` for an evaluation that runs over ``eval_dataloader`` once.

    Args:
        eval_dataloader: anything with ``len()`` (batches per evaluation); its ``batch_size``
            over the training ``dataloader``'s, when both are ints, is the batch-size ratio
            (else 1).
        dataloader: the training loader, or None.
        grad_accum_steps: micro-batches per optimizer step, >= 1.

    Returns:
        The prior; None for an empty loader (an evaluation of no batches).

    Raises:
        ValueError: ``eval_dataloader`` has no ``len()``, or ``grad_accum_steps`` < 1.
    """
    try:
        batches = len(eval_dataloader)
    except TypeError:
        raise ValueError(
            f"eval_dataloader has no len() ({type(eval_dataloader).__name__}); "
            "give a loader with len() or leave it out"
        ) from None
    if batches < 1:
        return None
    eval_size, train_size = loader_batch_size(eval_dataloader), loader_batch_size(dataloader)
    ratio = eval_size / train_size if eval_size and train_size else 1.0
    return eval_cost_prior(batches, ratio, grad_accum_steps)


@dataclass(frozen=True, slots=True)
class PhaseForecast:
    """One phase as measured so far and as projected over the rest of the job.

    Attributes:
        name: the phase name.
        occurrences: occurrences so far (phases ending at the same step count as one).
        spent_s: their total time, seconds.
        mean_s: projected cost of one future occurrence; None before any occurrence.
        mean_ci_s: its 95% half-width; None before any occurrence.
        period_steps: period in steps; None when unknown or one-off.
        period_source: where the period came from: "hint", "inferred", "single" (guessed from
            one occurrence), "one-off" or "unknown".
        remaining: occurrences expected before the last step; None when the job length is
            unknown.
        remaining_s: their cost; None when ``remaining`` or ``mean_s`` is unknown (0.0 when
            ``remaining`` is 0).
        remaining_ci_s: its 95% half-width, None alike.
        cost_source: where ``mean_s`` comes from: "measured" (occurrences so far), "prior"
            (a ``PhaseCostPrior``, before the first occurrence) or "unknown" (neither).
    """

    name: str
    occurrences: int
    spent_s: float
    mean_s: float | None
    mean_ci_s: float | None
    period_steps: int | None
    period_source: str
    remaining: int | None
    remaining_s: float | None
    remaining_ci_s: float | None
    cost_source: str = "measured"


@dataclass(slots=True)
class _PhaseStats:
    occurrences: int = 0
    spent_s: float = 0.0
    first_s: float = 0.0
    # A later occurrence's cost over the first's, (low, high), while only the first is known:
    # by default the first itself, +-_SINGLE_OCCURRENCE_REL_CI.
    first_to_later: tuple[float, float] = _SINGLE_OCCURRENCE_RANGE
    # Running stats of occurrences 2.. (Welford), and of the occurrence being accumulated.
    later_n: int = 0
    later_mean: float = 0.0
    later_m2: float = 0.0
    current_s: float = 0.0
    last_step: int = -1
    steps: list[int] = field(default_factory=list)

    def close_current(self) -> None:
        # Fold the occurrence being accumulated into the later-occurrence stats.
        if self.occurrences >= 2:
            self.later_n += 1
            delta = self.current_s - self.later_mean
            self.later_mean += delta / self.later_n
            self.later_m2 += delta * (self.current_s - self.later_mean)


#: The phase ``ETSHook`` records ``torch.compile``'s compile time under: one-off unless a
#: period is given for it (a recompile is not expected to recur on a schedule).
COMPILE_PHASE = "compile"
#: Phases that never recur on a schedule unless ``phase_every`` says so.
ONE_OFF_PHASES = frozenset({COMPILE_PHASE})


class PhaseTracker:
    """Measures named non-training phases and projects them over the remaining schedule.

    ``record`` is O(1) (phases are rare). Durations of a phase that ends several times at the same
    step (e.g. two validation loaders marked "eval") add up to one occurrence. No locking: the
    ``Forecaster`` calls it under its own lock.

    Attributes:
        job: the schedule projections follow (``total_steps``, hinted periods).
        total_s: seconds of every phase recorded so far.
        events: ``record`` calls so far.
    """

    def __init__(self, job: JobModel) -> None:
        """Track phases of ``job``; nothing recorded yet."""
        self.job = job
        self._stats: dict[str, _PhaseStats] = {}
        self._priors: dict[str, PhaseCostPrior] = {}
        self.total_s = 0.0
        self.events = 0

    def set_prior(self, name: str, prior: PhaseCostPrior | None) -> None:
        """Price phase ``name`` with ``prior`` until it is first measured (None: no prior).

        Args:
            name: the phase name.
            prior: its expected cost per occurrence, or None to remove one.
        """
        if prior is None:
            self._priors.pop(name, None)
        else:
            self._priors[name] = prior

    def record(
        self,
        name: str,
        duration_s: float,
        step: int,
        first_to_later: tuple[float, float] | None = None,
    ) -> None:
        """A phase ``name`` took ``duration_s`` and ended after ``step`` global steps.

        Args:
            name: the phase name (any string).
            duration_s: its duration in seconds; negative and NaN count as 0.
            step: global steps completed when it ended; the same step as the phase's previous
                record adds to that occurrence.
            first_to_later: with the phase's first record only: what a later occurrence costs
                over this one, ``(low, high)`` factors (0 < low <= high), while this is the
                only one measured (a first occurrence known to be a lower bound: the first
                epoch's start-up, ``forecast.epochs.SEED_TO_LATER_START``); None: this one's
                cost, +-50%.

        Raises:
            ValueError: ``first_to_later`` is not ``(low, high)`` with ``0 < low <= high``.
        """
        if first_to_later is not None:
            low, high = first_to_later
            if not 0 < low <= high < math.inf:
                raise ValueError(f"first_to_later must be 0 < low <= high, got {first_to_later}")
        stats = self._stats.get(name)
        if stats is None:
            stats = self._stats[name] = _PhaseStats(
                first_to_later=first_to_later or _SINGLE_OCCURRENCE_RANGE
            )
        duration_s = max(0.0, duration_s)
        if step == stats.last_step:
            stats.current_s += duration_s
            if stats.occurrences == 1:
                stats.first_s = stats.current_s
        else:
            stats.close_current()
            stats.occurrences += 1
            stats.current_s = duration_s
            if stats.occurrences == 1:
                stats.first_s = duration_s
            stats.last_step = step
            stats.steps.append(step)
            if len(stats.steps) > _PERIOD_HISTORY:
                del stats.steps[0]
        stats.spent_s += duration_s
        self.total_s += duration_s
        self.events += 1

    def _cost(self, stats: _PhaseStats) -> tuple[float, float]:
        # Mean cost of a future occurrence and its 95% half-width.
        n = stats.later_n + (1 if stats.occurrences >= 2 else 0)
        if n == 0:
            low, high = stats.first_to_later
            return stats.first_s * (low + high) / 2, stats.first_s * (high - low) / 2
        # Later occurrences, including the one still accumulating.
        mean = (stats.later_mean * stats.later_n + stats.current_s) / n
        m2 = stats.later_m2
        if stats.later_n:
            m2 += (stats.current_s - stats.later_mean) ** 2 * stats.later_n / n
        nu0 = _PHASE_CV_WEIGHT
        var = (nu0 * (_PHASE_CV_SCALE * mean) ** 2 + m2) / (nu0 + n - 1)
        return mean, student_t_quantile(0.975, nu0 + n - 1) * math.sqrt(var / n)

    def _period(self, name: str, stats: _PhaseStats | None) -> tuple[int | None, str]:
        hint = self.job.phase_periods.get(name)
        if hint is not None:
            return (None, "one-off") if hint == 0 else (hint, "hint")
        if name in ONE_OFF_PHASES:
            return None, "one-off"
        if stats is None or stats.occurrences == 0:
            return None, "unknown"
        gaps = [b - a for a, b in zip(stats.steps, stats.steps[1:], strict=False) if b > a]
        if gaps:
            return max(1, round(median(gaps))), "inferred"
        since_start = stats.steps[0] - self.job.initial_step
        if since_start <= 0:
            # Only before the first step (setup, an initial evaluation): assume it does not recur.
            return None, "one-off"
        return since_start, "single"

    def _remaining(self, name: str, period: int | None, anchor: int, step: int) -> int | None:
        total = self.job.total_steps
        if total is None:
            return None
        count = 0
        on_period_at_total = False
        if period is not None:
            # Occurrences at anchor + k * period (k >= 1) with step <= s <= total (s < total for
            # an epoch start: none follows the last step).
            last = total - 1 if name == EPOCH_START else total
            k_min = max(1, -(-(step - anchor) // period))
            k_max = (last - anchor) // period
            count = max(0, k_max - k_min + 1)
            on_period_at_total = last == total and (total - anchor) % period == 0
        if name in self.job.final_phases and not on_period_at_total and anchor < total:
            count += 1  # the run after the last step, off the period
        return count

    def project(self, step: int, iteration_s: float | None = None) -> tuple[PhaseForecast, ...]:
        """Every known phase (observed or hinted), projected from ``step`` global steps on.

        Future occurrences are expected every period after the last one (or after step 0 for a
        hinted phase not yet seen), up to ``job.total_steps`` (an epoch start: before it), and
        once after the last step for a phase in ``job.final_phases``. A phase not yet seen
        costs its prior (``set_prior``) at ``iteration_s``, if it has one.

        Args:
            step: global steps completed now.
            iteration_s: the steady step time, seconds, for priors in training steps; None:
                such priors are not used.

        Returns:
            One ``PhaseForecast`` per phase: observed ones in first-seen order, then hinted ones
            (periods, then final phases).
        """
        names = list(self._stats)
        for name in (*self.job.phase_periods, *sorted(self.job.final_phases)):
            if name not in names:
                names.append(name)
        out = []
        for name in names:
            stats = self._stats.get(name)
            period, source = self._period(name, stats)
            cost_source = "unknown"
            if stats is not None and stats.occurrences:
                anchor = stats.last_step
                mean, mean_ci = self._cost(stats)
                cost_source = "measured"
            else:
                anchor, mean, mean_ci = 0, None, None
                prior = self._priors.get(name)
                if prior is not None and (iteration_s is not None or not prior.train_steps):
                    mean = prior.cost_s(iteration_s or 0.0)
                    mean_ci, cost_source = prior.rel_ci * mean, "prior"
            remaining = self._remaining(name, period, anchor, step)
            rem_s: float | None = None
            rem_ci: float | None = None
            if remaining == 0:
                rem_s = rem_ci = 0.0
            elif remaining is not None and mean is not None and mean_ci is not None:
                rem_s, rem_ci = remaining * mean, remaining * mean_ci
            out.append(
                PhaseForecast(
                    name=name,
                    occurrences=stats.occurrences if stats else 0,
                    spent_s=stats.spent_s if stats else 0.0,
                    mean_s=mean,
                    mean_ci_s=mean_ci,
                    period_steps=period,
                    period_source=source,
                    remaining=remaining,
                    remaining_s=rem_s,
                    remaining_ci_s=rem_ci,
                    cost_source=cost_source,
                )
            )
        return tuple(out)


def remaining_phase_time(phases: tuple[PhaseForecast, ...]) -> tuple[float, float]:
    """Sum of projected phase time and its 95% half-width (phases independent: root-sum-square).

    Phases whose cost is still unknown (hinted, not yet seen, no prior) contribute nothing.

    Args:
        phases: the output of ``PhaseTracker.project``.

    Returns:
        ``(total_s, ci_s)`` in seconds.
    """
    total = sum(p.remaining_s for p in phases if p.remaining_s is not None)
    ci = math.sqrt(sum(p.remaining_ci_s**2 for p in phases if p.remaining_ci_s is not None))
    return total, ci


#: ``ended_short_note``: how near ``total_steps / grad_accum_steps`` steps (relative to
#: ``total_steps``) a job must end for a total counted in batches to be the likely cause
#: (epochs of ``ceil(batches / N)`` steps end a little past it).
SLIP_TOLERANCE = 0.15


def ended_short_note(
    steps_done: int, total_steps: int | None, grad_accum_steps: int, *, total_given: bool = True
) -> str | None:
    """What to say of a job closed at ``steps_done``, before its length: every ETA was for
    the whole length. A loop that stopped early on purpose reads it as a fact; one whose
    ``total_steps`` counted batches under gradient accumulation (``epochs * len(loader)`` kept
    after adding ``grad_accum_steps``: every ETA N times too long) learns why. Nothing tells
    the two apart for sure (a loop that breaks at a quarter of its length under accumulation 4
    looks the same), so this is a note, not a warning.

    The accumulation hint is added only where that slip fits: ``total_steps`` was given (not
    worked out from ``epochs`` and the loader) and the job ended within ``SLIP_TOLERANCE`` of
    ``total_steps / grad_accum_steps`` steps.

    Args:
        steps_done: the global step it ended at (the initial step included).
        total_steps: the length it was given or worked out; None: unknown (nothing to say).
        grad_accum_steps: batches per optimizer step.
        total_given: whether ``total_steps`` was given as such.

    Returns:
        The note's text, or None where it was not short.
    """
    if total_steps is None or steps_done <= 0 or steps_done >= total_steps:
        return None
    text = (
        f"finished at step {steps_done} of the {total_steps} steps it was given: every ETA "
        f"was for all {total_steps}"
    )
    slip = (
        total_given
        and grad_accum_steps > 1
        and abs(steps_done * grad_accum_steps - total_steps) <= SLIP_TOLERANCE * total_steps
    )
    if slip:
        text += (
            f" (a step is an optimizer step: with grad_accum_steps={grad_accum_steps}, a "
            "total_steps counted in batches is that many times too long)"
        )
    return text
