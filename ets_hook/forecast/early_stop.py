"""Early stopping: when will the framework's patience rule stop the job?

An ETA bar assumes the job runs to ``max_steps``; with early stopping it may end long before.
``EarlyStopTracker`` follows the monitored metric at each evaluation, applies the same patience
rule as the framework (``EarlyStoppingRule``), and forecasts the step at which that rule will
fire (``EarlyStopForecast``) by fitting a learning curve to the values seen so far and applying the
rule to noisy continuations of it.

The rule (Keras ``EarlyStopping``, Lightning ``EarlyStopping``, HF ``EarlyStoppingCallback``):
an evaluation *improves* when its value beats the best so far by more than ``min_delta``
(``value < best - min_delta`` for mode "min", ``value > best + min_delta`` for "max"); otherwise
the wait count grows by one, and the rule fires at the first evaluation where the wait count
reaches ``patience``. The first finite value always improves. Mapping of the frameworks'
arguments (``EarlyStoppingRule.from_keras`` / ``from_lightning`` / ``from_hf`` do it):

- Keras ``EarlyStopping(monitor, min_delta, patience, mode)`` and Lightning
  ``EarlyStopping(monitor, min_delta, patience, mode, check_finite)``: ``min_delta`` is used as
  ``abs(min_delta)``; the best value moves only on an improvement (by more than ``min_delta``).
  Lightning stops at once on a NaN/inf value when ``check_finite`` (its default); Keras counts it
  as no improvement. Patience 0 behaves as 1 in both (the first non-improvement stops).
  Not modelled: Keras ``baseline``/``start_from_epoch``, Lightning ``stopping_threshold``/
  ``divergence_threshold``.
- HF ``EarlyStoppingCallback(early_stopping_patience, early_stopping_threshold)`` with
  ``TrainingArguments(metric_for_best_model, greater_is_better)``: ``patience`` =
  ``early_stopping_patience``, ``min_delta`` = ``early_stopping_threshold``, mode "max" when
  ``greater_is_better`` else "min". The Trainer's ``state.best_metric`` moves on *any* strict
  improvement, even one below the threshold (``best_on_any_improvement=True``); a NaN counts as
  no improvement.

Forecast method (``EarlyStopTracker.forecast``), on the values made "lower is better" (negated
for mode "max"):

1. Fit three monotone families to the finite (step, value) history (the last ``MAX_FIT_POINTS``):
   a flat line ``a``; exponential decay ``a + b·exp(-c·u)`` with ``u`` the step scaled to the
   observed span; inverse power law ``a + b·t^(-c)`` with ``t`` the step (shifted by one
   evaluation gap when the first step is <= 0). ``b >= 0`` (never worsening); ``c`` by a fixed
   log grid, ``a`` and ``b`` by linear least squares at each grid point (closed form, vectorised).
2. Weigh the families by Akaike weights; share ``SIMULATIONS`` continuations among them by weight.
   Each continuation refits its family to a residual bootstrap of the history (the curve's
   parameter uncertainty) and adds Gaussian observation noise with the residual SD of the fit.
3. Project each continuation at the observed evaluation cadence (median gap between evaluation
   steps) up to ``max_steps``, apply the rule from the tracker's current best and wait count, and
   record the first step where it fires (``max_steps`` when it never does).
4. ``expected_stop_step`` is the median of those steps; ``earliest_stop_step`` and
   ``latest_stop_step`` their 10th and 90th percentiles; ``probability_stops_early`` the share
   that fire before ``max_steps``.

Limitations: curves that get worse (overfitting, divergence) or that drop again after a plateau
(learning-rate schedule steps, grokking) are outside the families and are forecast as flattening;
noise is taken as independent and Gaussian; the cadence is taken as constant; at most
``MAX_PROJECTED_EVALS`` evaluations are projected (beyond that: ``max_steps``). With 4-6
evaluations the asymptote is poorly determined and the forecast is wide (see
``benchmarks/early_stop.py`` for the measured error against evaluations seen).

Everything is numpy + stdlib, pure and deterministic (fixed random seed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np

#: Fewest finite evaluations a forecast is made from.
MIN_POINTS = 4
#: Most recent finite evaluations the curve is fitted to.
MAX_FIT_POINTS = 256
#: Continuations simulated per forecast.
SIMULATIONS = 256
#: Most future evaluations projected; continuations still running after them end at max_steps.
MAX_PROJECTED_EVALS = 4000
#: Quantiles of the simulated stopping steps reported as earliest / latest.
LOW_QUANTILE, HIGH_QUANTILE = 0.10, 0.90

_EXP_GRID = np.geomspace(0.02, 60.0, 64)  # decay rates in units of the observed span
_POW_GRID = np.geomspace(0.02, 8.0, 56)  # power-law exponents
_SEED = 0x5E7

Mode = Literal["min", "max"]


@dataclass(frozen=True, slots=True)
class EarlyStoppingRule:
    """The patience rule of the frameworks' early-stopping callbacks (see the module docstring).

    Attributes:
        patience: evaluations without improvement after which the rule fires (>= 1).
        min_delta: the amount (>= 0) by which a value must beat the best to count as improvement.
        mode: "min" (lower is better, e.g. a loss) or "max" (e.g. accuracy).
        best_on_any_improvement: the best value moves on any strict improvement, even one not
            larger than ``min_delta`` (HF Trainer); False: only on an improvement (Keras,
            Lightning).
        stop_on_non_finite: a NaN/inf value fires the rule at once (Lightning ``check_finite``);
            False: it counts as no improvement (Keras, HF).
        min_stop_step: the loop goes on after the rule fired until this global step (>= 0;
            Lightning's ``min_epochs`` / ``min_steps``): it stops at the later of the two.
    """

    patience: int
    min_delta: float = 0.0
    mode: Mode = "min"
    best_on_any_improvement: bool = False
    stop_on_non_finite: bool = False
    min_stop_step: int = 0

    def __post_init__(self) -> None:
        """Validate the arguments.

        Raises:
            ValueError: ``patience`` is not an int >= 1, ``min_delta`` is not a finite number
                >= 0, or ``mode`` is not "min" or "max".
        """
        if isinstance(self.patience, bool) or not isinstance(self.patience, int):
            raise ValueError(f"patience must be an int >= 1, got {self.patience!r}")
        if self.patience < 1:
            raise ValueError(f"patience must be an int >= 1, got {self.patience!r}")
        if (
            isinstance(self.min_delta, bool)
            or not isinstance(self.min_delta, (int, float))
            or not math.isfinite(self.min_delta)
            or self.min_delta < 0
        ):
            raise ValueError(f"min_delta must be a finite number >= 0, got {self.min_delta!r}")
        if self.mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {self.mode!r}")
        step = self.min_stop_step
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"min_stop_step must be an int >= 0, got {step!r}")

    @classmethod
    def coerce(cls, value: Any) -> EarlyStoppingRule | None:
        """``ETSHook(early_stopping=...)``: None, a rule, ``(patience, min_delta, mode)``, or
        those as a mapping.

        A list (or any sequence but a string) is taken as the tuple, and any mapping as the
        keyword arguments: YAML, Hydra and OmegaConf (``ListConfig``, ``DictConfig``) have no
        tuples.

        Args:
            value: None, an ``EarlyStoppingRule``, a tuple or list of its first 1-3 arguments,
                or a mapping of its argument names (``{"patience": 3, "mode": "max"}``).

        Returns:
            The rule, or None.

        Raises:
            ValueError: ``value`` is none of those, or its values are invalid (named as given).
        """
        if value is None or isinstance(value, cls):
            return value
        try:
            if isinstance(value, Mapping):
                keys = [k for k in value if k not in _RULE_KEYS]
                if keys:
                    raise ValueError(f"unknown key(s) {keys!r}: use {', '.join(_RULE_KEYS)}")
                return cls(**{str(k): value[k] for k in value})
            sequence = isinstance(value, Sequence) and not isinstance(value, (str, bytes))
            if sequence and 1 <= len(value) <= 3:
                return cls(*value)
        except (ValueError, TypeError) as exc:  # named as the caller wrote it
            raise ValueError(f"early_stopping={value!r}: {exc}") from None
        raise ValueError(
            "early_stopping must be (patience, min_delta, mode) (a tuple or list, the last two "
            "optional), a mapping of those names, or an EarlyStoppingRule, "
            f"got {value!r}"
        )

    @classmethod
    def from_keras(
        cls, patience: int, min_delta: float = 0.0, mode: Mode = "min"
    ) -> EarlyStoppingRule:
        """The rule of ``keras.callbacks.EarlyStopping`` (mode "auto" resolved by the caller).

        Args:
            patience: ``patience`` (0 behaves as 1).
            min_delta: ``min_delta`` (its absolute value is used, as Keras does).
            mode: "min" or "max".

        Returns:
            The rule.

        Raises:
            ValueError: invalid arguments (see the class).
        """
        return cls(max(int(patience), 1), abs(float(min_delta)), mode)

    @classmethod
    def from_lightning(
        cls, patience: int, min_delta: float = 0.0, mode: Mode = "min", check_finite: bool = True
    ) -> EarlyStoppingRule:
        """The rule of ``lightning.pytorch.callbacks.EarlyStopping``.

        Args:
            patience: ``patience`` (0 behaves as 1).
            min_delta: ``min_delta`` (its absolute value is used, as Lightning does).
            mode: ``mode``.
            check_finite: ``check_finite`` (a NaN/inf value stops training at once).

        Returns:
            The rule.

        Raises:
            ValueError: invalid arguments (see the class).
        """
        return cls(
            max(int(patience), 1), abs(float(min_delta)), mode, stop_on_non_finite=check_finite
        )

    @classmethod
    def from_hf(
        cls, patience: int, threshold: float = 0.0, greater_is_better: bool = False
    ) -> EarlyStoppingRule:
        """The rule of ``transformers.EarlyStoppingCallback`` with the Trainer's best metric.

        Args:
            patience: ``early_stopping_patience``.
            threshold: ``early_stopping_threshold``.
            greater_is_better: ``TrainingArguments.greater_is_better``.

        Returns:
            The rule (``best_on_any_improvement=True``).

        Raises:
            ValueError: invalid arguments (see the class).
        """
        mode: Mode = "max" if greater_is_better else "min"
        return cls(patience, float(threshold), mode, best_on_any_improvement=True)

    def sign(self) -> float:
        """+1 for mode "min", -1 for "max": ``sign * value`` is lower-is-better."""
        return 1.0 if self.mode == "min" else -1.0

    def advance(
        self, best: np.ndarray, wait: np.ndarray, z: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """One evaluation of the rule on lower-is-better values (vectorised; NaN: no improvement).

        Args:
            best: best lower-is-better value so far (+inf before any).
            wait: evaluations without improvement so far.
            z: the new lower-is-better value(s) (``sign() * value``).

        Returns:
            The new ``(best, wait)``; the rule fires where ``wait >= patience``.
        """
        improved = z < best - self.min_delta
        wait = np.where(improved, 0, wait + 1)
        moved = (z < best) if self.best_on_any_improvement else improved
        best = np.where(moved, z, best)
        return best, wait


#: The names ``EarlyStoppingRule.coerce`` takes in a mapping: the rule's fields.
_RULE_KEYS: tuple[str, ...] = tuple(f.name for f in fields(EarlyStoppingRule))


@dataclass(frozen=True, slots=True)
class EarlyStopForecast:
    """When the early-stopping rule is expected to stop the job.

    Attributes:
        expected_stop_step: median predicted step at which the rule fires; ``max_steps`` when it
            is not expected to fire (<= ``max_steps``).
        earliest_stop_step: 10th percentile of the predicted stopping step.
        latest_stop_step: 90th percentile of the predicted stopping step.
        probability_stops_early: estimated probability that the rule fires before ``max_steps``.
        max_steps: the step the job ends at without early stopping.
        evaluations: finite evaluations the forecast rests on.
        family: the curve family with the largest Akaike weight ("exp", "power", "flat"), or
            "stopped" when the rule has already fired.
    """

    expected_stop_step: int
    earliest_stop_step: int
    latest_stop_step: int
    probability_stops_early: float
    max_steps: int
    evaluations: int
    family: str

    @property
    def range_steps(self) -> tuple[int, int]:
        """``(earliest_stop_step, max_steps)``: where the job plausibly ends."""
        return self.earliest_stop_step, self.max_steps


def total_range_s(
    forecast: EarlyStopForecast, total_s: float, cadence_s: float
) -> tuple[float, float]:
    """The job's total wall time if it stops at the expected step and if it runs to the end.

    Args:
        forecast: the early-stop forecast.
        total_s: the predicted total wall time of the job run to ``forecast.max_steps``.
        cadence_s: wall time per step still to come (step time + overhead per step).

    Returns:
        ``(total at expected_stop_step, total_s)``; the low end never below 0 nor above
        ``total_s``. Phases projected between the expected stop and ``max_steps`` are not removed.
    """
    saved = max(forecast.max_steps - forecast.expected_stop_step, 0) * max(cadence_s, 0.0)
    return min(max(total_s - saved, 0.0), total_s), total_s


class EarlyStopTracker:
    """Applies an ``EarlyStoppingRule`` to a job's evaluations and forecasts when it will fire.

    Not thread-safe; ``forecast()`` is cached until the next ``observe``.
    """

    def __init__(self, rule: EarlyStoppingRule, max_steps: int) -> None:
        """Start with no evaluations.

        Args:
            rule: the patience rule.
            max_steps: the step the job ends at without early stopping (>= 1).

        Raises:
            ValueError: ``max_steps`` is not an int >= 1.
        """
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be an int >= 1, got {max_steps!r}")
        self.rule = rule
        self.max_steps = max_steps
        self._steps: list[int] = []
        self._values: list[float] = []  # lower-is-better (sign * value); NaN for non-finite
        self._best = math.inf
        self._wait = 0
        self._stopped_step: int | None = None
        self._cache: tuple[int, EarlyStopForecast | None] | None = None

    @property
    def evaluations(self) -> int:
        """Evaluations observed (finite or not)."""
        return len(self._steps)

    @property
    def best(self) -> float | None:
        """Best monitored value so far, in the metric's own sign; None before a finite one."""
        return None if math.isinf(self._best) else self.rule.sign() * self._best

    @property
    def wait(self) -> int:
        """Evaluations since the last improvement."""
        return self._wait

    @property
    def stopped(self) -> bool:
        """The rule has fired."""
        return self._stopped_step is not None

    @property
    def stopped_step(self) -> int | None:
        """The evaluation step at which the rule fired, or None."""
        return self._stopped_step

    def observe(self, step: int, value: float) -> bool:
        """Record one evaluation of the monitored metric.

        Args:
            step: the global step of the evaluation (strictly increasing, 0..``max_steps``).
            value: the metric's value; NaN/inf count as no improvement, or fire the rule at once
                with ``rule.stop_on_non_finite``.

        Returns:
            True when the rule fires at this evaluation (only the first time).

        Raises:
            ValueError: ``step`` is not an int, not above the previous one, or outside
                0..``max_steps``; ``value`` is not a real number.
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise ValueError(f"step must be an int, got {step!r}")
        step = int(step)
        if not 0 <= step <= self.max_steps:
            raise ValueError(f"step must be in 0..{self.max_steps} (max_steps), got {step}")
        if self._steps and step <= self._steps[-1]:
            raise ValueError(f"step must increase: got {step} after {self._steps[-1]}")
        try:
            value = float(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"value must be a real number, got {value!r}") from exc
        finite = math.isfinite(value)
        z = self.rule.sign() * value if finite else math.nan
        self._steps.append(step)
        self._values.append(z)
        self._cache = None
        if self._stopped_step is not None:
            return False
        if not finite and self.rule.stop_on_non_finite:
            self._stopped_step = step
            return True
        best, wait = self.rule.advance(np.float64(self._best), np.int64(self._wait), np.float64(z))
        self._best, self._wait = float(best), int(wait)
        if self._wait >= self.rule.patience:
            self._stopped_step = step
            return True
        return False

    def forecast(self) -> EarlyStopForecast | None:
        """Forecast the step at which the rule fires (see the module docstring for the method).

        Returns:
            The forecast; once the rule has fired, its step (family "stopped"). None with fewer
            than ``MIN_POINTS`` finite evaluations, or when evaluations went on past the step the
            rule fired at (the loop did not stop: the rule is not what ends it).
        """
        n = len(self._steps)
        if self._cache is not None and self._cache[0] == n:
            return self._cache[1]
        result = self._forecast()
        self._cache = (n, result)
        return result

    def _forecast(self) -> EarlyStopForecast | None:
        if self._stopped_step is not None:
            s = min(max(self._stopped_step, self.rule.min_stop_step), self.max_steps)
            if self._steps[-1] > s:
                return None
            return EarlyStopForecast(s, s, s, 1.0, self.max_steps, self._finite_count(), "stopped")
        steps = np.asarray(self._steps, dtype=np.float64)
        z = np.asarray(self._values, dtype=np.float64)
        ok = np.isfinite(z)
        if int(ok.sum()) < MIN_POINTS:
            return None
        gap = max(round(float(np.median(np.diff(steps)))), 1) if len(steps) > 1 else 1
        last = int(steps[-1])
        horizon = min((self.max_steps - last) // gap, MAX_PROJECTED_EVALS)
        if horizon <= 0:
            s = self.max_steps
            return EarlyStopForecast(s, s, s, 0.0, s, int(ok.sum()), "flat")
        x, y = steps[ok][-MAX_FIT_POINTS:], z[ok][-MAX_FIT_POINTS:]
        future = last + gap * np.arange(1, horizon + 1, dtype=np.float64)
        families = _families(x, y, gap)
        rng = np.random.default_rng(_SEED)
        curves = _simulate(families, x, y, future, rng)  # (SIMULATIONS, horizon)
        stops = self._first_fire(curves, future)
        if self.rule.min_stop_step:  # a fired rule stops the loop only from that step on
            stops = np.minimum(np.maximum(stops, self.rule.min_stop_step), self.max_steps)
        q = np.quantile(stops, [0.5, LOW_QUANTILE, HIGH_QUANTILE], method="inverted_cdf")
        top = max(families, key=lambda f: f.weight).name
        return EarlyStopForecast(
            expected_stop_step=int(q[0]),
            earliest_stop_step=int(q[1]),
            latest_stop_step=int(q[2]),
            probability_stops_early=float(np.mean(stops < self.max_steps)),
            max_steps=self.max_steps,
            evaluations=int(ok.sum()),
            family=top,
        )

    def _finite_count(self) -> int:
        return sum(1 for v in self._values if math.isfinite(v))

    def _first_fire(self, curves: np.ndarray, future: np.ndarray) -> np.ndarray:
        """The step at which the rule first fires on each row of ``curves`` (else max_steps)."""
        sims = curves.shape[0]
        best = np.full(sims, self._best)
        wait = np.full(sims, self._wait, dtype=np.int64)
        stop = np.full(sims, float(self.max_steps))
        running = np.ones(sims, dtype=bool)
        for k in range(curves.shape[1]):
            best, wait = self.rule.advance(best, wait, curves[:, k])
            fired = running & (wait >= self.rule.patience)
            stop[fired] = future[k]
            running &= ~fired
            if not running.any():
                break
        return stop.astype(np.int64)


@dataclass(frozen=True, slots=True)
class _Family:
    """One fitted curve family: ``value(t) = a + b * basis(t; c)`` (flat: ``b = 0``)."""

    name: str
    grid: np.ndarray  # (G,) candidate c
    basis: np.ndarray  # (G, n) basis at the history's steps
    k: int  # free parameters
    weight: float  # Akaike weight
    sigma: float  # residual SD of the fit
    fitted: np.ndarray  # (n,) fitted values


def _basis(
    name: str, grid: np.ndarray, t: np.ndarray, x0: float, span: float, shift: float
) -> np.ndarray:
    """Basis values (G, len(t)) of family ``name`` at steps ``t``."""
    if name == "exp":
        return np.exp(-np.outer(grid, (t - x0) / span))
    base = (t + shift) / (x0 + shift)
    return np.exp(-np.outer(grid, np.log(base)))


def _fit(basis: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Least squares ``y ≈ a + b * basis[g]`` with ``b >= 0`` at every grid point, for each row.

    Args:
        basis: (G, n).
        y: (R, n) rows to fit.

    Returns:
        ``(g, a, b)`` per row: the best grid index and its coefficients.
    """
    phi_mean = basis.mean(axis=1)
    phi_c = basis - phi_mean[:, None]
    var = np.einsum("gn,gn->g", phi_c, phi_c)
    usable = var > 1e-12 * basis.shape[1]
    var_safe = np.where(usable, var, 1.0)
    y_mean = y.mean(axis=1)
    y_c = y - y_mean[:, None]
    cov = y_c @ phi_c.T  # (R, G)
    b = np.where(usable, np.maximum(cov / var_safe, 0.0), 0.0)
    sse = np.einsum("rn,rn->r", y_c, y_c)[:, None] - 2 * b * cov + b * b * var
    g = np.argmin(sse, axis=1)
    rows = np.arange(y.shape[0])
    b_best = b[rows, g]
    a_best = y_mean - b_best * phi_mean[g]
    return g, a_best, b_best


def _families(x: np.ndarray, y: np.ndarray, gap: int) -> list[_Family]:
    """Fit flat, exponential and power-law curves to the history; Akaike-weighted."""
    n = len(x)
    x0 = float(x[0])
    span = max(float(x[-1] - x[0]), 1.0)
    shift = float(gap) if x0 <= 0 else 0.0
    spread = float(np.sum((y - y.mean()) ** 2))
    floor = 1e-10 * spread + 1e-300
    out: list[tuple[str, np.ndarray, np.ndarray, int, float, np.ndarray]] = []
    flat_fit = np.full(n, y.mean())
    out.append(("flat", np.zeros(1), np.zeros((1, n)), 1, spread, flat_fit))
    for name, grid in (("exp", _EXP_GRID), ("power", _POW_GRID)):
        basis = _basis(name, grid, x, x0, span, shift)
        g, a, b = _fit(basis, y[None, :])
        fitted = a[0] + b[0] * basis[g[0]]
        out.append((name, grid, basis, 3, float(np.sum((y - fitted) ** 2)), fitted))
    aic = np.array([n * math.log(max(sse, floor) / n) + 2 * k for _, _, _, k, sse, _ in out])
    w = np.exp(-(aic - aic.min()) / 2)
    w /= w.sum()
    return [
        _Family(name, grid, basis, k, float(wi), math.sqrt(sse / max(n - k, 1)), fitted)
        for (name, grid, basis, k, sse, fitted), wi in zip(out, w)
    ]


def _simulate(
    families: list[_Family],
    x: np.ndarray,
    y: np.ndarray,
    future: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """(SIMULATIONS, len(future)) noisy continuations, shared among families by weight."""
    n = len(x)
    x0 = float(x[0])
    span = max(float(x[-1] - x[0]), 1.0)
    gap = float(future[1] - future[0]) if len(future) > 1 else float(future[0] - x[-1])
    shift = gap if x0 <= 0 else 0.0
    counts = _allocate([f.weight for f in families], SIMULATIONS)
    blocks = []
    for fam, count in zip(families, counts):
        if count == 0:
            continue
        resid = (y - fam.fitted) * math.sqrt(n / max(n - fam.k, 1))
        boot = fam.fitted[None, :] + resid[rng.integers(0, n, size=(count, n))]
        if fam.name == "flat":
            level = boot.mean(axis=1)
            curve = np.repeat(level[:, None], len(future), axis=1)
        else:
            g, a, b = _fit(fam.basis, boot)
            fb = _basis(fam.name, fam.grid, future, x0, span, shift)  # (G, H)
            curve = a[:, None] + b[:, None] * fb[g]
        blocks.append(curve + rng.normal(0.0, fam.sigma, size=curve.shape))
    return np.concatenate(blocks, axis=0)


def _allocate(weights: list[float], total: int) -> list[int]:
    """Split ``total`` into integer counts proportional to ``weights`` (largest remainders)."""
    raw = np.asarray(weights) * total
    counts = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - counts))[: total - int(counts.sum())]:
        counts[i] += 1
    return [int(c) for c in counts]
