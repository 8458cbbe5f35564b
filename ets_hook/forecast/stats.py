"""Steady-state step-time estimators: measured, trace-based (plug-in) and their fusion.

Three kinds of evidence about the steady-state time of one training step feed one estimate:

- the **prior** (``StepTimePrior``): what is known before much is measured, e.g. "the first step on
  CPU takes 1.0-1.3x the steady state plus 2-40 ms";
- the **measured** estimate (``estimate_measured``): per-step wall times after automatic warm-up
  truncation (MSER), with a 95% confidence interval that stays honest under autocorrelation (batch
  means) and for tiny samples (a conjugate prior on the step-time CV);
- the **trace-based** estimate (``TraceEstimate``): whatever the ETS predictor makes of the captured
  steps, handed in with its own uncertainty.

``fuse`` combines estimates by inverse-variance weighting and widens the result when they disagree
(PDG/Birge scale factor), so that one confident-but-wrong source cannot make the answer
over-confident. ``StepTimeSeries`` is the O(1)-per-step store behind the measured estimator.

Contracts:
- Times are float seconds; intervals are half-widths at ``level`` (default 0.95): the estimate
  claims ``iteration_s - ci_s <= true mean <= iteration_s + ci_s`` with that probability.
- The quantity estimated is the *mean* steady-state step time: the sum of future steps, and so the
  ETA, is mean x count. (The median is reported beside it; it is not what a total is made of.)
- Everything here is pure numpy + stdlib; nothing imports torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# np.median's first call imports numpy.ma (8-16 ms on this machine): imported here, with the
# hook, instead of inside the job's second training step, whose time it inflated ~2x on a 12 ms
# step (the first measured estimate; benchmarks/bf16_warmup.py, setting "numpy_ma").
import numpy.ma

from .contention import MIN_BURST_SERIES, lag1, split_contention
from .distributions import normal_quantile, student_t_quantile

DEFAULT_LEVEL = 0.95

# Source labels used in ``Estimate.source`` (and so in ``Prediction.source``).
SOURCE_PRIOR = "prior"
SOURCE_MEASURED = "measured"
SOURCE_TRACE = "trace"
SOURCE_FUSED = "fused"


# --------------------------------------------------------------------------------------------
# Value types
# --------------------------------------------------------------------------------------------


def _check_range(name: str, value: tuple[float, float]) -> None:
    lo, hi = value
    if not (0.0 < lo <= hi and math.isfinite(hi)):
        raise ValueError(f"{name} must be (lo, hi) with 0 < lo <= hi < inf, got {value}")


#: CPU autocast (bf16/fp16): seconds its first step takes beyond an fp32 first step's excess
#: (oneDNN creating and JIT-compiling its low-precision primitives), added to the high end of
#: the first-step excess range (``StepTimePrior.for_low_precision``).
LOW_PRECISION_FIRST_STEP_EXTRA_S = 0.004


def _plus_excess(
    ratio: tuple[float, float], excess_s: tuple[float, float], step_s: float
) -> tuple[float, float]:
    """``ratio`` plus ``excess_s / step_s`` at both ends (``ratio`` alone for a ``step_s``
    that is not finite and > 0)."""
    if not (math.isfinite(step_s) and step_s > 0.0):
        return ratio
    return ratio[0] + excess_s[0] / step_s, ratio[1] + excess_s[1] / step_s


@dataclass(frozen=True, slots=True)
class StepTimePrior:
    """What is believed about warm-up and noise before the data say otherwise.

    Ranges are ~95% ranges of (step time / steady-state mean). The defaults were measured on a
    2-core CPU machine. A step covered by a range says the steady state lies in
    ``[observed / hi, observed / lo]``: the midpoint of that interval is the bias-corrected value,
    its half-width a systematic uncertainty.

    The step-time CV prior is a scaled-inverse-chi-square on the per-step variance with
    ``cv_weight`` pseudo-degrees of freedom and scale ``cv_scale``: 6 and 8% put 95% of the
    prior mass on CV in [5%, 17%], the range measured here. The data outweigh it after a few
    dozen steps.

    Attributes:
        first_step_ratio: range of (first step - its excess) / steady state.
        first_step_excess_s: range of the seconds the process's first step takes on top of
            that (one-off start-up: primitives created, memory first touched): the steady
            state lies in ``[(first - excess_hi) / ratio_hi, (first - excess_lo) / ratio_lo]``
            (``first_step_range_s``).
        early_ratio: range of steps 2..``early_steps`` (1-based) / steady state, before the
            early excess.
        early_excess_s: range of the extra seconds each of those steps takes on top (a
            warm-up that is about the same time whatever the step's length: a large share of
            a 3 ms step, none of a 100 ms one); see ``early_ratio_at``.
        second_step_ratio: range of the process's second step (1-based step 2) / the early
            steps after it, on top of the early range: that step is slower still.
        second_step_excess_s: range of the extra seconds the second step takes on top of
            that; see ``second_step_ratio_at``.
        capture_ratio: range of steps inside ets-hook's capture window / steady state.
        capture_spike_steps: the one-off cost after the capture window, in steady steps
            (``0 <= lo <= hi``).
        capture_spike_excess_s: seconds of that cost on top of its steps (``0 <= lo <= hi``).
        early_steps: last (1-based) step carrying the early-ratio bias, >= 1.
        early_in_window: the capture window's steps are early steps too: a capture ratio
            measured on this job's window (the capture's own cost only) is widened by
            ``early_ratio_at`` (``Forecaster.set_capture_window(measured=True)``).
        cv_scale: scale of the step-time CV prior, in (0, 10).
        cv_weight: pseudo-degrees of freedom of the CV prior, > 0.

    Raises:
        ValueError: at construction, a ratio range is not ``0 < lo <= hi < inf``, or another
            field is out of its range.
    """

    # The process's first step against the steady state, over the accuracy benchmark's 198 runs
    # of its 18 jobs without a loader, compile or rank (2026-12-06, 11 runs, the hook on): a
    # ratio of 1.21-6.53x (2.5-97.5%; median 2.48) but an excess of 2.8-39.6 ms (median 14.8)
    # whatever the step's length (0.5-100 ms steps). The ratio range used before, 1.3-2.3x,
    # held 36% of them: long steps (1.2-1.4x) were read as half their length and the fused
    # step-3 estimate pulled low (gru-medium -13%: 55 and 52 ms steps, estimate 46.7 ms).
    first_step_ratio: tuple[float, float] = (1.0, 1.3)
    first_step_excess_s: tuple[float, float] = (0.002, 0.040)
    # Steps 3..6 against the steady state, fresh processes, ets-hook's own work left out
    # (benchmarks/bf16_warmup.py, 5 zoo workloads x 4 rounds, and the accuracy benchmark's
    # 14 zoo jobs): 1.2-1.4x for 3-4 ms MLP and LSTM steps, 0.93-1.04x for 15-30 ms
    # transformer and GPT ones, 0.8-1.0x for 25-110 ms ones, fp32 and bf16 alike: more a
    # fixed 0.5-2 ms per step than a share of it. Replaying the 80 bf16_warmup runs through the
    # forecaster (in-sample), step-5 rate error with the capture on, median / P90 (signed):
    # ratio 0.82-1.09 (before) 17.5/37.6 (+15.9)%; ratio 1.0-1.3 12.9/24.0 (+0.9)% but -10 to
    # -16% on the longer steps; this ratio and an excess of 0.5-2 ms 8.1/21.0 (+1.7)%.
    # On a quiet machine (2026-12-06, load 0.3-1.1, benchmarks/accuracy.py's 25 jobs, steps
    # 2-6 at a median 1.02-1.09x the steady state, the capture included) an excess of 0.5-2 ms
    # over-corrected: the predicted step time's median signed error at steps 3 / 5 was -3.5 to
    # -9.7% in all 5 runs; 0-0.5 ms: +0.2 to +5.9% in 3 runs; 0-1 ms: -1.7 to +2.0% in 2 runs
    # (total-time median at step 5: 8.0-13.3% / 7.6-11.8% / 4.6-8.6%; the sub-ms MLP and the
    # embedding model, whose early excess is larger, do worse with the smaller range).
    # On a slower VM of the same kind later that day (its steps ~1.4x longer, early steps of
    # 3-8 ms jobs 1.25-1.45x the steady state) 0-1 ms under-corrected: total-time signed
    # median +9.7 / +4.6% at steps 3 / 5 (3 runs, 72 job runs), coverage of the 95% interval
    # 72 / 78%; 0-2 ms, alternated with it: +9.1 / +2.9%, coverage 77 / 88%, total-time
    # median at step 5 6.3% against 8.0%, half-width 13.2% against 12.3% (2 runs). The
    # excess is the machine's as much as the job's: 0-2 ms spans both VMs.
    early_ratio: tuple[float, float] = (0.95, 1.05)
    early_excess_s: tuple[float, float] = (0.0, 0.002)
    # The second step is slower than the early steps after it: with the capture window after
    # three clean steps (2026-12-06, benchmarks/accuracy.py's 20 zoo jobs without a loader,
    # fresh processes), step 2 ran a median 1.20x the steady state and step 3 1.07x, about
    # 1.07x + 0.5-3 ms for step 2 against 1.0x + 0.5-1 ms for step 3 over 0.5-100 ms steps
    # (without a hook: 1.03-1.19x on 20-100 ms steps, 1.3-1.6x on 3-5 ms ones). This extra
    # range on top of the early one brought the step-time error at step 3 on five small zoo
    # workloads x 3 runs from 9.8 to 3.6% (median; signed +9.8 -> +1.3%).
    second_step_ratio: tuple[float, float] = (1.0, 1.15)
    second_step_excess_s: tuple[float, float] = (0.0, 0.001)
    # Steps inside ets-hook's own capture window (profiler on, shapes recorded) against the
    # steady state: on CPU 1.01-1.64 (10-90%), median 1.21, over the 72 jobs of
    # benchmarks/collect.py; the range's inverse midpoint is 1/1.2.
    capture_ratio: tuple[float, float] = (1.0, 1.5)
    # The one-off cost after the window (the profiler's disable on the training thread and the
    # decode), in steady steps: on CPU 2.5-42 (2.5-97.5%), median 13, over 56 runs of the 14
    # accuracy-benchmark jobs; the range's midpoint and half-width are used.
    capture_spike_steps: tuple[float, float] = (2.0, 26.0)
    # Seconds of that one-off cost on top of its steady steps (a capture path's decode costs
    # about a fixed time, whatever the step's length: ``NativeOpCapture.cpu_costs``).
    capture_spike_excess_s: tuple[float, float] = (0.0, 0.0)
    # Steps 2..early_steps (1-based) carry the early_ratio bias.
    early_steps: int = 6
    early_in_window: bool = True
    # The step-time CV prior. A weaker one (5% at 3 pseudo-df: CV in [2.8%, 18.6%]) replayed
    # better on the stored step series at step 3 (coverage of the true steady step / median
    # half-width 87% / 18.9% -> 90% / 17.6%), but in the full benchmark its narrower intervals
    # on calm jobs no longer covered their warm-up bias (mlp-dataloading -11 to -12% outside
    # +-12%): total-time coverage at steps 3 / 5 fell to 73-81% / 77-81% against 77-92% /
    # 77-85% for this one, alternated, two runs each (benchmarks/RESULTS.md).
    cv_scale: float = 0.08
    cv_weight: float = 6.0

    def __post_init__(self) -> None:
        _check_range("first_step_ratio", self.first_step_ratio)
        _check_range("early_ratio", self.early_ratio)
        _check_range("second_step_ratio", self.second_step_ratio)
        _check_range("capture_ratio", self.capture_ratio)
        for name in (
            "first_step_excess_s",
            "early_excess_s",
            "second_step_excess_s",
            "capture_spike_steps",
            "capture_spike_excess_s",
        ):
            lo, hi = getattr(self, name)
            if not 0.0 <= lo <= hi or not math.isfinite(hi):
                raise ValueError(f"{name} must be 0 <= lo <= hi, got {(lo, hi)}")
        if self.early_steps < 1:
            raise ValueError(f"early_steps must be >= 1, got {self.early_steps}")
        if not 0.0 < self.cv_scale < 10.0:
            raise ValueError(f"cv_scale must be in (0, 10), got {self.cv_scale}")
        if not self.cv_weight > 0.0:
            raise ValueError(f"cv_weight must be > 0, got {self.cv_weight}")

    def first_step_range_s(self, first_s: float) -> tuple[float, float]:
        """The steady step time's range after a first step of ``first_s`` seconds.

        ``[(first_s - excess_hi) / ratio_hi, (first_s - excess_lo) / ratio_lo]``, where the
        excess is at most half the first step (a first step shorter than the excess range —
        batches already prefetched — still says the steady state is not far below it) and
        the low end at least 0.

        Args:
            first_s: the first step's length, seconds (> 0).

        Returns:
            ``(low, high)`` seconds, ``0 <= low <= high``.
        """
        r_lo, r_hi = self.first_step_ratio
        e_lo, e_hi = self.first_step_excess_s
        high = max(first_s - e_lo, 0.5 * first_s) / r_lo
        low = min(max(first_s - e_hi, 0.0) / r_hi, high)
        return low, high

    def early_ratio_at(self, step_s: float) -> tuple[float, float]:
        """The range of an early step / the steady state for steps of about ``step_s``.

        Args:
            step_s: the early steps' length, seconds; not finite or not > 0: the excess is
                ignored.

        Returns:
            ``early_ratio`` plus ``early_excess_s / step_s`` at both ends.
        """
        return _plus_excess(self.early_ratio, self.early_excess_s, step_s)

    def second_step_ratio_at(self, step_s: float) -> tuple[float, float]:
        """The range of the second step / the early steps after it, for steps of about
        ``step_s``.

        Args:
            step_s: the second step's length, seconds; not finite or not > 0: the excess is
                ignored.

        Returns:
            ``second_step_ratio`` plus ``second_step_excess_s / step_s`` at both ends.
        """
        return _plus_excess(self.second_step_ratio, self.second_step_excess_s, step_s)

    def for_low_precision(self) -> StepTimePrior:
        """This prior for a job whose forward runs under bf16/fp16 autocast on the CPU.

        Measured with ``benchmarks/bf16_warmup.py`` (fresh processes, no hook, small zoo
        jobs): bf16 adds time to the first step only, a fixed +3-4 ms over fp32's first step
        on a CPU with avx512_bf16 (oneDNN creates and JIT-compiles its bf16 primitives on first
        use; 3.6-9x the short steady steps there); on an avx2-only CPU, which emulates bf16
        (steps 5-10x fp32's), the first step ran at 1.02-1.21x the steady state (excess 2-27
        ms, fp32's 9-25 ms). Either way an excess, not a ratio: the first-step excess range's
        high end is raised by ``LOW_PRECISION_FIRST_STEP_EXTRA_S``. (A 2-9.5x ratio used
        before read a 250 ms emulated-bf16 first step at 1.2x as a 30-120 ms steady state:
        -67% at step 1.)

        Returns:
            A copy with that excess range; a CUDA prior is returned unchanged (not measured).
        """
        if self.first_step_ratio[1] > 10.0:  # the CUDA prior: already wide, not measured
            return self
        low_s, high_s = self.first_step_excess_s
        return dataclasses.replace(
            self, first_step_excess_s=(low_s, high_s + LOW_PRECISION_FIRST_STEP_EXTRA_S)
        )

    @classmethod
    def for_device(cls, device: str) -> StepTimePrior:
        """Default prior for a device type: ``"cpu"`` (measured) or ``"cuda"`` (deliberately wide:
        cuDNN autotuning, lazy CUDA init and allocator growth can make step 1 tens of times the
        steady state; not measured on this project's machines yet).

        Args:
            device: a device type or device string; case and an index (``"cuda:1"``) are
                ignored.

        Raises:
            ValueError: the device type is neither "cpu" nor "cuda".
        """
        kind = device.split(":", 1)[0].lower()
        if kind == "cpu":
            return cls()
        if kind == "cuda":
            return cls(
                first_step_ratio=(1.0, 60.0),
                first_step_excess_s=(0.0, 0.0),
                early_ratio=(0.8, 1.5),
                early_excess_s=(0.0, 0.0),
                second_step_ratio=(1.0, 1.0),  # not measured on GPUs: no extra correction
                second_step_excess_s=(0.0, 0.0),
                # not measured on GPUs yet: host-side profiler cost is mostly hidden by
                # asynchronous execution, so no correction; the disable and decode are host
                # work the device waits for, so a wide range
                capture_ratio=(1.0, 1.0),
                capture_spike_steps=(0.0, 30.0),
                early_steps=5,
                early_in_window=False,
                cv_scale=0.05,
                cv_weight=4.0,
            )
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")

    @staticmethod
    def _inverse_centre_and_rel_half(ratio: tuple[float, float]) -> tuple[float, float]:
        # steady = observed / r with r in [lo, hi]  =>  steady in observed * [1/hi, 1/lo].
        # Returns the midpoint multiplier of that interval and its relative half-width.
        lo, hi = ratio
        centre = 0.5 * (1.0 / lo + 1.0 / hi)
        return centre, 0.5 * (1.0 / lo - 1.0 / hi) / centre


@dataclass(frozen=True, slots=True)
class Estimate:
    """One estimate of the steady-state mean step time, with its uncertainty.

    Attributes:
        iteration_s: the estimated mean step time, seconds.
        ci_s: half-width of the ``level`` confidence interval of the *mean* step time.
        source: a ``SOURCE_*`` label or a trace estimator's own label.
        level: confidence level of ``ci_s``.
        noise_sd_s: long-run standard deviation of one step (per-step SD x sqrt(autocorrelation
            factor)): the SD of a sum of R future steps is about sqrt(R) * noise_sd_s. NaN when
            unknown.
        median_s: median step time; NaN when unknown.
        samples: steps the estimate rests on (after truncation).
        warmup_steps: steps dropped as warm-up.
        recurring_period_steps: the period of recurring unmarked work counted in
            ``iteration_s`` (``forecast.contention``), or None.
        recurring_excess_s: what one occurrence of it adds over a calm step, seconds (0.0
            without).
        level_shifted: the steps' level moved and stayed (``forecast.contention``): the
            estimate rests on the steps since the change only.
    """

    iteration_s: float
    ci_s: float
    source: str
    level: float = DEFAULT_LEVEL
    noise_sd_s: float = math.nan
    median_s: float = math.nan
    samples: int = 0
    warmup_steps: int = 0
    recurring_period_steps: int | None = None
    recurring_excess_s: float = 0.0
    level_shifted: bool = False

    @property
    def rel_ci(self) -> float:
        """Relative half-width, ``ci_s / iteration_s``."""
        return self.ci_s / self.iteration_s if self.iteration_s > 0 else math.inf


@dataclass(frozen=True, slots=True)
class TraceEstimate:
    """What a trace-based estimator (the ETS predictor) hands to the forecaster.

    ``iteration_s`` is its prediction of the steady-state step time, ``ci_s`` the half-width of a
    ``level`` interval around it (its honest model error: a held-out MRE of 5% is a 95% half-width
    of roughly 2 x 1.25 x 5% of the value for Laplace-like errors). ``step`` is the last captured
    step it used, if it updates per captured step.

    Attributes:
        iteration_s: predicted steady-state step time, seconds, finite and > 0.
        ci_s: half-width at ``level``, seconds, finite and >= 0.
        source: non-empty label (default "trace").
        level: confidence level, in (0, 1).
        step: last captured step used, or None.

    Raises:
        ValueError: at construction, a field breaks the constraints above.
    """

    iteration_s: float
    ci_s: float
    source: str = SOURCE_TRACE
    level: float = DEFAULT_LEVEL
    step: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.iteration_s) and self.iteration_s > 0):
            raise ValueError(f"iteration_s must be finite and > 0, got {self.iteration_s}")
        if not (math.isfinite(self.ci_s) and self.ci_s >= 0):
            raise ValueError(f"ci_s must be finite and >= 0, got {self.ci_s}")
        if not 0.0 < self.level < 1.0:
            raise ValueError(f"level must be in (0, 1), got {self.level}")
        if not self.source:
            raise ValueError("source must be a non-empty string")

    def as_estimate(self, level: float = DEFAULT_LEVEL) -> Estimate:
        """This estimate as an ``Estimate`` at ``level`` (normal rescaling of the half-width).

        The result carries no noise SD, median or sample counts (NaN / 0).

        Args:
            level: the target confidence level, in (0, 1) (not checked).

        Raises:
            ValueError: ``level`` >= 1 or <= -1 and differs from ``self.level``.
        """
        ci_s = self.ci_s
        if level != self.level:
            ci_s *= normal_quantile(0.5 + level / 2) / normal_quantile(0.5 + self.level / 2)
        return Estimate(self.iteration_s, ci_s, self.source, level=level)


# --------------------------------------------------------------------------------------------
# Warm-up truncation
# --------------------------------------------------------------------------------------------


def mser_truncation(
    y: np.ndarray, batch_size: int = 5, max_fraction: float = 0.5, tolerance: float = 0.5
) -> tuple[int, bool]:
    """MSER-m truncation point: how many leading raw samples to drop as warm-up.

    White's Marginal Standard Error Rule on batch means of ``batch_size`` samples: the batch count
    ``d`` minimising ``sum_{j>d} (z_j - mean_{j>d})^2 / (k - d)^2``, i.e. the squared standard
    error of the kept mean, searched over the first ``max_fraction`` of the batches only (near
    the end the statistic is noise-dominated: the standard safeguard). Then, as in the
    one-standard-error rule of model selection, the smallest ``d`` whose statistic is within
    ``tolerance`` standard errors (those of the minimum's statistic) of the minimum: plain MSER
    often cuts 10-20 extra steps of pure noise, which costs data and makes the estimate jump
    between refreshes (``tolerance=0`` is plain MSER). Trailing samples that do not fill a batch
    are ignored. O(n).

    Args:
        y: raw per-step times (1-D float array), first step first.
        batch_size: samples per batch mean, >= 1 (MSER-5: 5; MSER-1: 1); not checked.
        max_fraction: the share of the batches the search covers, in (0, 1); not checked.
        tolerance: the parsimony tolerance in standard errors of the statistic, >= 0.

    Returns:
        ``(samples to drop, at_edge)``: ``at_edge`` is true when the minimum sits at the end of
        the search range (the warm-up may still be going on). ``(0, False)`` below 3 batches.
    """
    n = len(y)
    k = n // batch_size
    if k < 3:
        return 0, False
    z = y[: k * batch_size].reshape(k, batch_size).mean(axis=1) if batch_size > 1 else y[:k]
    # Suffix sums: tail j.. has count k-j, sum S1[j], sum of squares S2[j].
    s1 = np.cumsum(z[::-1])[::-1]
    s2 = np.cumsum((z * z)[::-1])[::-1]
    d_max = max(1, int(k * max_fraction))
    count = k - np.arange(d_max + 1, dtype=np.float64)
    sse = s2[: d_max + 1] - s1[: d_max + 1] ** 2 / count
    stat = np.maximum(sse, 0.0) / count**2
    best = int(np.argmin(stat))
    # Parsimony: the smallest d whose statistic is within `tolerance` standard errors of the
    # minimum (the statistic is a variance estimate with ~k-d df: relative SE sqrt(2/(k-d))).
    limit = stat[best] * (1.0 + tolerance * math.sqrt(2.0 / (k - best)))
    d = int(np.argmax(stat <= limit))
    return d * batch_size, best == d_max and d_max < k - 1


# --------------------------------------------------------------------------------------------
# Measured estimator
# --------------------------------------------------------------------------------------------

# Below this many kept samples the interval uses the raw samples (plus the CV prior); from it
# on, non-overlapping batch means with batch size floor(sqrt(m)).
_BATCH_MIN_SAMPLES = 16
# MSER-5 needs enough batches to resolve anything; below this, MSER on raw samples (MSER-1).
_MSER5_MIN_SAMPLES = 50
# From this many kept samples on, the lag-1 autocorrelation (AR(1) view) is estimated too.
_AR_MIN_SAMPLES = 8
# MSER parsimony tolerance, in standard errors of the MSER statistic (see mser_truncation).
_MSER_TOLERANCE = 0.5
# From this many kept samples on, the kept part is checked for remaining drift.
_DRIFT_MIN_SAMPLES = 10
# Kept samples of 3-6 raw steps are capped at 1.5x their median before the mean (replay of 84
# accuracy-benchmark jobs: P90 error of the measured estimate after 5 / 8 / 10 steps 38 / 64 /
# 54% -> 32 / 41 / 42%, medians unchanged within 1 point).
_SMALL_SAMPLE_MIN = 3
_SMALL_SAMPLE_MAX = 6
_SMALL_SAMPLE_CAP = 1.5
#: Steps that differ in length by design (``estimate_measured(variable=True)``): the prior on
#: their coefficient of variation is this wide and this weak (pseudo-df), not the steady
#: state's few percent: a handful of such steps has a wide interval until their own spread is
#: known.
VARIABLE_STEPS_CV_SCALE = 0.3
VARIABLE_STEPS_CV_WEIGHT = 1.0
# Drift beyond this many long-run standard errors counts (3: ~0.3% false alarms if stationary).
_DRIFT_Z = 3.0
_RHO_MAX = 0.95


@dataclass(frozen=True, slots=True)
class _Interval:
    mean: float
    ci: float
    noise_sd: float


def _mean_interval(x: np.ndarray, level: float, prior: StepTimePrior, stride: int = 1) -> _Interval:
    """Interval for the mean of a (possibly autocorrelated) stationary series ``x``.

    ``stride`` is how many raw steps one element of ``x`` stands for (``StepTimeSeries`` folds old
    samples pairwise when it compacts): the prior's per-step variance is divided by it and the
    reported per-step noise SD multiplied back.

    Variance of the mean = sigma^2 * tau / m, with
    - sigma^2 the per-element variance pooled with the CV prior (nu0 pseudo-df at cv_scale), so
      one or two samples still give a finite, wide, honest interval;
    - tau >= 1 the autocorrelation factor: from the AR(1) view (lag-1 autocorrelation, bias
      corrected) once m >= 8, overridden by non-overlapping batch means with batch size
      floor(sqrt(m)) (Flegal & Jones 2010) once m >= 16 when those show clearly more
      correlation than lag 1 explains.
    Degrees of freedom follow the dominating term (Satterthwaite-style blend).
    """
    m = len(x)
    mean = float(x.mean())
    nu0 = prior.cv_weight
    prior_var = (prior.cv_scale * mean) ** 2 / stride
    s2 = float(x.var(ddof=1)) if m >= 2 else 0.0
    dof_raw = nu0 + m - 1
    sigma2 = (nu0 * prior_var + (m - 1) * s2) / dof_raw
    tau, df = 1.0, dof_raw
    if m >= _AR_MIN_SAMPLES and s2 > 0:
        # AR(1) view: tau = (1 + rho) / (1 - rho), rho from the lag-1 autocorrelation with its
        # small-sample bias (about -(1 + 4 rho) / m for an estimated mean) added back.
        r = lag1(x)
        rho = min(max(r + (1.0 + 4.0 * r) / m, 0.0), _RHO_MAX)
        tau = (1.0 + rho) / (1.0 - rho)
        df_tau = max(m / tau - 1.0, 1.0)
    if m >= _BATCH_MIN_SAMPLES and s2 > 0:
        size = math.isqrt(m)
        b = m // size
        # Most recent b*size samples: the oldest are the ones closest to the warm-up.
        z = x[m - b * size :].reshape(b, size).mean(axis=1)
        tau_b = size * float(z.var(ddof=1)) / s2
        # Batch means are the model-free check on the AR(1) view; their estimate has only b-1
        # df, so they take over when they show clearly more correlation (beyond ~2 of their
        # standard errors), e.g. periodic or long-memory slowdowns that lag 1 does not see.
        if tau_b > tau * (1.0 + 2.0 * math.sqrt(2.0 / (b - 1))):
            tau, df_tau = tau_b, float(b - 1)
    if tau > 1.0:
        # The correlated term carries df_tau df; blend towards it as it dominates.
        share = 1.0 - 1.0 / tau
        df = 1.0 / (share / df_tau + (1.0 - share) / dof_raw)
    var_mean = sigma2 * tau / m
    q = student_t_quantile(0.5 + level / 2, df)
    ci = q * math.sqrt(var_mean)
    if m >= _AR_MIN_SAMPLES:
        # A level shift inside x drives rho to its cap and the df to ~1 (t ~ 12.7): the
        # interval would reach far past any step seen. The mean of the steps to come lies
        # within the levels the steps have run at: no wider than the farther extreme.
        ci = min(ci, max(float(x.max()) - mean, mean - float(x.min())))
    return _Interval(mean, ci, math.sqrt(sigma2 * tau * stride))


def _one_step_estimate(
    value_s: float, half_width_s: float, prior: StepTimePrior, level: float
) -> Estimate:
    """A prior-based estimate from one step: ``value_s`` with a 95% half-width ``half_width_s``
    scaled to ``level``."""
    ci_scale = normal_quantile(0.5 + level / 2) / normal_quantile(0.975)
    return Estimate(
        value_s,
        half_width_s * ci_scale,
        SOURCE_PRIOR,
        level=level,
        noise_sd_s=value_s * prior.cv_scale,
        median_s=value_s,
        samples=1,
        warmup_steps=0,
    )


def _first_step_estimate(first_s: float, prior: StepTimePrior, level: float) -> Estimate:
    low, high = prior.first_step_range_s(first_s)
    return _one_step_estimate(0.5 * (low + high), 0.5 * (high - low), prior, level)


def warmup_step_estimate(step_s: float, prior: StepTimePrior, level: float) -> Estimate:
    """The steady step time from one step that is not the process's first, while every step
    so far is warm-up (it compiled, or followed a compile): that step's own time, with the
    first-step prior's relative interval (source "prior"). The first-step prior's correction
    (its excess, its ratio) is the process's first step's: applied to a later step it would
    halve a step already near the steady state.

    Args:
        step_s: the step's time, seconds (compile time left out), > 0.
        prior: the prior whose first-step range sets the interval's width.
        level: the interval's confidence level, in (0, 1).

    Returns:
        The estimate: ``value == step_s``, ``samples == 1``.
    """
    low, high = prior.first_step_range_s(step_s)
    rel_half_width = (high - low) / (high + low) if high + low > 0 else 1.0
    return _one_step_estimate(step_s, step_s * rel_half_width, prior, level)


def truncation_point(y: np.ndarray, min_warmup: int = 1) -> tuple[int, bool]:
    """Warm-up steps to drop from ``y`` (raw per-step times, first step first).

    At least ``min_warmup`` (the first step is warm-up by the prior's own account); beyond that
    MSER-5 (with the parsimony tolerance) once there are >= 50 samples, MSER-1 on raw samples
    below: with fewer than 10 batches, MSER-5's 5-step resolution is coarser than the 1-3-step
    warm-ups seen on CPU. Always keeps at least one sample.

    Args:
        y: raw per-step times, first step first.
        min_warmup: leading steps always dropped.

    Returns:
        ``(steps to drop, at_edge)`` as ``mser_truncation`` says; ``(0, False)`` for <= 1 step.
    """
    n = len(y)
    if n <= 1:
        return 0, False
    batch = 5 if n >= _MSER5_MIN_SAMPLES else 1
    d, at_edge = mser_truncation(y, batch, 0.5, _MSER_TOLERANCE) if n >= 4 else (0, False)
    return min(max(d, min_warmup), n - 1), at_edge


def estimate_measured(
    y: np.ndarray,
    prior: StepTimePrior | None = None,
    level: float = DEFAULT_LEVEL,
    *,
    min_warmup: int = 1,
    stride: int = 1,
    capture: tuple[int, int] | None = None,
    variable: bool = False,
) -> Estimate | None:
    """Measured estimate from per-step times ``y`` (seconds, oldest first). Pure; O(len(y)).

    - 0 samples: ``None``.
    - 1 sample (the first step): the prior alone, the midpoint of
      ``StepTimePrior.first_step_range_s(y[0])``, source "prior".
    - more: drop the warm-up (``truncation_point``) and estimate the mean of the rest with an
      autocorrelation-robust interval (``_mean_interval``). From 8 kept steps on, bursts (a few
      steps far above the rest) are left out of the mean, their excess per step added to the
      interval — unless they keep a steady beat (the job's own unmarked recurring work, e.g.
      an evaluation every N steps): then their excess spread over the period is added to the
      mean — and after a lasting shift of the level only the steps at the new level are
      kept (``forecast.contention``). While only 3-6 steps are kept, each is first capped at
      1.5x their median (a lone spike among a handful of steps). From 10
      kept steps on, if the kept part still drifts (its first 40% and last half differ by more
      than 3 long-run standard errors, or MSER's minimum sits at the edge of its search range),
      estimate from the recent half and add the drift as systematic uncertainty. Otherwise
      correct kept steps 2..early_steps by the prior's early ratio (step 2 also by its
      second-step ratio) and add its systematic uncertainty. The first step counts only
      while it is the only one (the one-sample case above).

    Args:
        y: per-step times (1-D float array), seconds, oldest first.
        prior: warm-up and noise prior; None for ``StepTimePrior()``.
        level: confidence level of the interval, in (0, 1) (not checked: values <= 0 give a
            meaningless interval).
        min_warmup: leading raw steps always dropped (with ``stride == 1``; otherwise 1
            element).
        stride: raw steps per element of ``y``, >= 1 (``StepTimeSeries`` compacts long
            series). With ``stride > 1`` the first element covers the whole start-up, so the
            first-step prior and the early-step and capture corrections no longer apply; only
            MSER and the interval do.
        capture: ``(start, end)`` indices of raw steps that ran inside the capture window;
            kept ones are corrected by the prior's ``capture_ratio`` (instead of its early
            ratio), with its systematic uncertainty.
        variable: the steps differ in length by design (the batches change shape,
            ``capture.input_shapes``): their plain mean is the steady state, so only the
            ``min_warmup`` leading steps are dropped, and no step is left out or capped as a
            burst, a spike or a drift; the interval is the mean's, from their own spread
            pooled with a wide CV prior (``VARIABLE_STEPS_CV_SCALE``) instead of the prior's.

    Returns:
        The estimate (source "prior" for one sample, else "measured"; ``samples`` and
        ``warmup_steps`` in raw steps), or None for an empty ``y``.

    Raises:
        ValueError: ``level`` >= 1 or <= -1 (from the quantile functions).
    """
    prior = prior or StepTimePrior()
    n = len(y)
    if n == 0:
        return None
    raw = stride == 1
    if raw and n == 1:
        return _first_step_estimate(float(y[0]), prior, level)
    if variable:
        d, warmup_ongoing = min(min_warmup if raw else 1, n - 1), False
    else:
        d, warmup_ongoing = truncation_point(y, min_warmup if raw else 1)
    x = y[d:]
    index = np.arange(d, n)  # raw step index of each element of x (stride 1)
    burst_excess = recurring_s = recurring_se_s = 0.0
    recurring_count = 0
    recurring_period: int | None = None
    shifted = False
    if raw and not variable and len(x) >= MIN_BURST_SERIES:
        # A noisy host: bursts out of the mean (their excess widens the interval), and after a
        # lasting shift of the level only the steps at the new level (forecast.contention).
        # Bursts at a steady beat are the job's own unmarked work: spread over their period.
        split = split_contention(x)
        if split.shift_index is not None:
            warmup_ongoing = False  # the level moved and stayed: that is not warm-up
            shifted = True
        x, index = x[split.keep], index[split.keep]
        if split.burst_period_steps is not None:
            recurring_s, recurring_se_s = split.burst_excess_s, split.burst_excess_se_s
            recurring_count, recurring_period = split.bursts, split.burst_period_steps
            burst_excess = split.contention_excess_s
        else:
            burst_excess = split.burst_excess_s
    if raw and not variable and _SMALL_SAMPLE_MIN <= len(x) <= _SMALL_SAMPLE_MAX:
        # A handful of steps: one far above the others is far more often a one-off (collector
        # pause, allocator growth, profiler buffer) than a share of the steady state; cap it.
        x = np.minimum(x, _SMALL_SAMPLE_CAP * float(np.median(x)))
    interval_prior = (
        dataclasses.replace(
            prior, cv_scale=VARIABLE_STEPS_CV_SCALE, cv_weight=VARIABLE_STEPS_CV_WEIGHT
        )
        if variable
        else prior
    )
    iv = _mean_interval(x, level, interval_prior, stride)
    mean, ci = iv.mean, iv.ci
    m = len(x)
    drifting = False
    if m >= _DRIFT_MIN_SAMPLES and not variable:
        # Stationarity check on the kept part (Geweke-style): its first 40% against its last
        # half. A difference beyond _DRIFT_Z long-run standard errors means the warm-up is not over
        # (or MSER could not cut far enough): estimate from the recent half and count the drift
        # as systematic uncertainty.
        early_part, recent = x[: (2 * m) // 5], x[m // 2 :]
        diff = float(early_part.mean() - recent.mean())
        se = iv.noise_sd / math.sqrt(stride) * math.sqrt(1 / len(early_part) + 1 / len(recent))
        if warmup_ongoing or abs(diff) > _DRIFT_Z * se:
            recent_iv = _mean_interval(recent, level, prior, stride)
            mean, ci = recent_iv.mean, math.hypot(recent_iv.ci, diff)
            drifting = True
    # Systematic early-step bias: kept raw steps with 1-based number 2..early_steps (not in the
    # recent half that a drifting series is estimated from).
    if raw and not drifting:
        captured = np.zeros(len(x), dtype=bool)
        if capture is not None:
            captured = (index >= capture[0]) & (index < capture[1])
        early = (index >= 1) & (index < prior.early_steps) & ~captured
        # The second step (index 1) is slower than the early ones after it, captured or not.
        second = (index == 1) & (prior.early_steps > 1)
        ratio_of = {
            "early": prior.early_ratio_at,
            "captured": lambda _: prior.capture_ratio,
            "second": prior.second_step_ratio_at,
        }
        for kind, mask in (("early", early), ("captured", captured), ("second", second)):
            if not mask.any():
                continue
            part_mean = float(x[mask].mean())
            ratio = ratio_of[kind](part_mean)
            inv_centre, rel_half = prior._inverse_centre_and_rel_half(ratio)
            share = float(mask.sum()) / len(x)
            mean += part_mean * (inv_centre - 1.0) * share
            bias = share * part_mean * inv_centre * rel_half
            ci = math.hypot(ci, bias * normal_quantile(0.5 + level / 2) / normal_quantile(0.975))
    # Bursts left out of the mean may come back: their excess per step widens the interval.
    ci = math.hypot(ci, burst_excess)
    if recurring_s > 0.0:
        # Recurring unmarked work (an evaluation every N steps): part of every step's share.
        mean += recurring_s
        q = student_t_quantile(0.5 + level / 2, recurring_count - 1)
        ci = math.hypot(ci, recurring_se_s * q)
    measured = Estimate(
        mean,
        ci,
        SOURCE_MEASURED,
        level=level,
        noise_sd_s=iv.noise_sd,
        median_s=float(np.median(x)),
        samples=len(x) * stride,
        warmup_steps=d * stride,
        recurring_period_steps=recurring_period if recurring_s > 0.0 else None,
        recurring_excess_s=recurring_s * recurring_period if recurring_period else 0.0,
        level_shifted=shifted,
    )
    # The first step is not fused in once a later one exists: its excess over the steady state
    # (2.8-39.6 ms over the accuracy benchmark's runs, 1.2-6.5x) says little about a step of
    # a few ms, and fused "where the two agree" it moved whichever jobs sat off the prior's
    # centre (long steps pulled low: gru-medium -13% at step 3). Replayed on the benchmark's
    # step series, step-3 step-time error, median / P90: zoo 6.3 / 20.7 -> 5.0 / 22.0%,
    # framework jobs 4.8 / 8.3 -> 3.2 / 8.3% (benchmarks/RESULTS.md, *The first step's excess*).
    return measured


# --------------------------------------------------------------------------------------------
# Fusion
# --------------------------------------------------------------------------------------------


def fuse(estimates: Sequence[Estimate | None], level: float = DEFAULT_LEVEL) -> Estimate | None:
    """Inverse-variance weighted mean of the given estimates, with a disagreement guard.

    Weights are 1/ci^2 (all at ``level``). If the estimates disagree by more than their
    uncertainties explain, the fused half-width is multiplied by the Birge ratio
    sqrt(chi^2 / (N - 1)) (the PDG scale factor), so the result stays honest when one source
    is biased.

    Args:
        estimates: estimates at ``level`` (not checked); ``None`` entries are ignored.
        level: confidence level of the inputs and the result, in (0, 1) (not checked).

    Returns:
        None when no estimate is given; the only estimate, unchanged, when one is; the first
        zero-width estimate, unchanged, when any has ``ci_s <= 0``; else a "fused" estimate
        whose noise SD and median are those of the first input that has them and whose sample
        and warm-up counts are the inputs' maxima.

    Raises:
        ValueError: ``level`` >= 1 or <= -1, when two or more estimates are fused.
    """
    items = [e for e in estimates if e is not None]
    if not items:
        return None
    if len(items) == 1:
        return items[0]
    exact = [e for e in items if e.ci_s <= 0.0]
    if exact:
        return exact[0]
    w = [1.0 / e.ci_s**2 for e in items]
    w_sum = math.fsum(w)
    mean = math.fsum(wi * e.iteration_s for wi, e in zip(w, items, strict=True)) / w_sum
    ci = 1.0 / math.sqrt(w_sum)
    # chi^2 in sigma units: ci = z * sigma.
    z = normal_quantile(0.5 + level / 2)
    chi2 = math.fsum(wi * (e.iteration_s - mean) ** 2 for wi, e in zip(w, items, strict=True))
    chi2 *= z * z
    scale = math.sqrt(chi2 / (len(items) - 1))
    if scale > 1.0:
        ci *= scale
    noise = [e.noise_sd_s for e in items if not math.isnan(e.noise_sd_s)]
    medians = [e.median_s for e in items if not math.isnan(e.median_s)]
    return Estimate(
        mean,
        ci,
        SOURCE_FUSED,
        level=level,
        noise_sd_s=noise[0] if noise else math.nan,
        median_s=medians[0] if medians else math.nan,
        samples=max(e.samples for e in items),
        warmup_steps=max(e.warmup_steps for e in items),
    )


# --------------------------------------------------------------------------------------------
# Step-time store
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class StepTimeSeries:
    """Per-step durations with an O(1) hot path and bounded memory.

    Non-finite durations are dropped and negative ones clamped to 0 when flushed (while
    ``count`` still counts the dropped ones when others arrive in the same flush).

    ``pending.append(duration_s)`` is the hot path (the forecaster binds it once). ``flush()``
    moves pending values into a float64 buffer of at most ``capacity`` elements. When the buffer is
    full it is compacted: adjacent pairs are averaged and ``stride`` (raw steps per element)
    doubles, so memory stays O(capacity) for any job length. New raw values are averaged in groups
    of ``stride`` before they are stored; the last ``< stride`` raw values wait in a carry (they
    are counted in ``count`` / ``total_s`` but not yet in ``values()``).

    Thread contract: one writer (``pending.append``) and readers that call ``flush`` under their
    own lock. ``flush`` never replaces the ``pending`` list, it deletes the consumed prefix, so an
    append racing a flush is never lost.

    Attributes:
        capacity: most stored elements, an even number >= 64.
        pending: raw durations (seconds) appended by the writer, not yet flushed.
        stride: raw steps per stored element (starts at 1, doubles at each compaction).
        count: raw values flushed so far.
        total_s: sum of the flushed raw values, seconds.
        first_s: the first flushed raw value; NaN before any.

    Raises:
        ValueError: at construction, ``capacity`` is odd or < 64.
    """

    capacity: int = 1 << 16
    pending: list[float] = field(default_factory=list)
    stride: int = 1
    count: int = 0
    total_s: float = 0.0
    first_s: float = math.nan
    _buf: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.float64))
    _size: int = 0
    _carry: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.capacity < 64 or self.capacity % 2:
            raise ValueError(f"capacity must be an even number >= 64, got {self.capacity}")

    def flush(self) -> None:
        """Fold pending raw values into the buffer. O(pending) amortised."""
        k = len(self.pending)
        if not k:
            return
        new = self.pending[:k]
        del self.pending[:k]
        if not all(map(math.isfinite, new)) or min(new) < 0.0:
            # A broken clock or caller bug must not poison every later estimate: drop
            # non-finite values, clamp negative ones.
            new = [max(v, 0.0) for v in new if math.isfinite(v)]
            if not new:
                return
        if self.count == 0:
            self.first_s = new[0]
        self.count += k
        self.total_s += math.fsum(new)
        if self._carry:
            new = self._carry + new
        i = 0
        while len(new) - i >= self.stride:
            if self._size == self.capacity:
                self._compact()
            take = min(self.capacity - self._size, (len(new) - i) // self.stride)
            chunk = np.asarray(new[i : i + take * self.stride], dtype=np.float64)
            if self.stride > 1:
                chunk = chunk.reshape(take, self.stride).mean(axis=1)
            self._reserve(self._size + take)
            self._buf[self._size : self._size + take] = chunk
            self._size += take
            i += take * self.stride
        self._carry = new[i:]

    def _reserve(self, n: int) -> None:
        if n > len(self._buf):
            grown = np.empty(min(self.capacity, max(n, 2 * len(self._buf), 256)), np.float64)
            grown[: self._size] = self._buf[: self._size]
            self._buf = grown

    def _compact(self) -> None:
        # Only called when full; capacity is even, so every element has a partner.
        half = self._size // 2
        self._buf[:half] = self._buf[: self._size].reshape(half, 2).mean(axis=1)
        self._size = half
        self.stride *= 2

    def values(self) -> np.ndarray:
        """The stored elements (each the mean of ``stride`` raw steps), oldest first.

        Returns:
            A float64 view of the internal buffer: a later ``flush`` may overwrite it.
        """
        return self._buf[: self._size]
