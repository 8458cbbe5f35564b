"""Step timing on the training thread: a step's wall time less what is not training.

A step runs from one step boundary to the next (``capture.steps`` finds the boundaries). Its
time as the forecaster sees it leaves out:

- the phases marked inside it (``ETSHook.phase``: evaluation, checkpoints), each recorded
  under its own name;
- ``torch.compile`` time outside those phases (``capture.compile_events``; compile time
  inside a phase is split off the phase instead);
- ets-hook's own work on the training thread: its step-boundary bookkeeping and reporters,
  and the reads of ``hook.prediction`` between boundaries. Early on that is a few 0.1 ms a
  step, far more than later: left in, it would make the first steps look slower than the
  steady state by a share that depends on the step's length.

``StepClock`` holds that bookkeeping; the hook decides what each part means (phases and
compile time go to the forecaster, the step's span to the capture window).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from .compile_events import CompileWatcher


@dataclass(frozen=True, slots=True)
class StepSpan:
    """One step as ``StepClock.end_step`` measured it (``time.perf_counter_ns`` clock).

    Attributes:
        start_ns: the step's start: the previous boundary (or the first training forward).
        end_ns: this boundary.
        duration_ns: training time: ``end_ns - start_ns`` less phases, compile time outside
            them and ets-hook's own work (>= 0).
        compile_ns: ``torch.compile`` time in the step outside its phases.
        own_ns: ets-hook's own work on the training thread in the step.
        work_start_ns: where the step's own work began: after the hook's work at the boundary
            that started it (the capture window's step starts there).
        own_in_work_ns: the part of ``own_ns`` after ``work_start_ns`` (reads of
            ``hook.prediction`` between boundaries).
        phase_ns: the outermost phases that ended in the step.
    """

    start_ns: int
    end_ns: int
    duration_ns: int
    compile_ns: int
    own_ns: int
    work_start_ns: int
    own_in_work_ns: int
    phase_ns: int = 0


class StepClock:
    """Times steps, phases, compile time and ets-hook's own work (training thread only).

    Attributes:
        training_thread: ``threading.get_ident()`` of the thread that ended the last step (at
            first: the thread that made the clock).
        compiles: the ``torch.compile`` event watcher, or None (not watched).
    """

    def __init__(self, start_ns: int, compiles: CompileWatcher | None) -> None:
        """A clock whose first step starts at ``start_ns`` (``time.perf_counter_ns``).

        Args:
            start_ns: step 0's start until ``restart`` moves it.
            compiles: the watcher whose compile events are taken out of steps and phases.
        """
        self.training_thread = threading.get_ident()
        self.compiles = compiles
        self._start_ns = start_ns
        # ets-hook's own work at the boundary that began the current step, and all of its own
        # work in the current step so far (that boundary's included).
        self._boundary_own_ns = 0
        self._own_ns = 0
        self._phase_ns = 0  # outermost phases ended in the current step
        self._phases: list[tuple[str, int]] = []  # open phases: name, start
        self._compiles_seen = 0
        self._compile_ns_in_phases = 0  # compile time taken out with a phase this step

    @property
    def in_phase(self) -> bool:
        """Whether a phase is open."""
        return bool(self._phases)

    def restart(self, now_ns: int) -> None:
        """The current step starts at ``now_ns`` instead (step 0 at the first training forward,
        when nothing was timed before it); the own work and the phases ended so far (before
        ``now_ns``: not in the step) are dropped."""
        self._start_ns = now_ns
        self._boundary_own_ns = self._own_ns = 0
        self._phase_ns = self._compile_ns_in_phases = 0

    def begin_phase(self, name: str) -> None:
        """Open phase ``name`` now (phases nest; the outermost one counts)."""
        self._phases.append((name, time.perf_counter_ns()))

    def end_phase(self) -> tuple[str, int, int] | None:
        """Close the innermost open phase.

        Returns:
            ``(name, duration_ns, compile_ns)`` when it was the outermost: its name, its time
            less the compile time inside it, and that compile time; None when it was nested or
            no phase was open.
        """
        if not self._phases:
            return None
        name, started_ns = self._phases.pop()
        if self._phases:
            return None
        ended_ns = time.perf_counter_ns()
        duration_ns = ended_ns - started_ns
        self._phase_ns += duration_ns
        compile_ns = 0
        compiles = self.compiles
        if compiles is not None and (compiles.count != self._compiles_seen or compiles.in_progress):
            compile_ns = min(compiles.compile_ns_in(started_ns, ended_ns), duration_ns)
            self._compile_ns_in_phases += compile_ns
        return name, duration_ns - compile_ns, compile_ns

    def count_own(self, started_ns: int) -> None:
        """ets-hook's own work from ``started_ns`` until now is not step time: counted when it
        ran on the training thread outside a phase (a phase's time is out of the step already)."""
        if not self._phases and threading.get_ident() == self.training_thread:
            self._own_ns += time.perf_counter_ns() - started_ns

    def end_step(self, now_ns: int, *, register_compiles: bool) -> StepSpan:
        """End the current step at ``now_ns``; the next starts there. Never raises.

        Args:
            now_ns: the boundary.
            register_compiles: look for ``torch.compile`` imported since (early steps).

        Returns:
            The step's span.
        """
        start_ns = self._start_ns
        compile_ns = 0
        compiles = self.compiles
        if compiles is not None:
            if register_compiles:
                compiles.ensure_registered()  # torch.compile called after the hook was created
            if compiles.count != self._compiles_seen or compiles.in_progress:
                compile_ns = self._take_compile_ns(compiles, start_ns, now_ns)
        own_ns = self._own_ns
        duration_ns = max(now_ns - start_ns - self._phase_ns - compile_ns - own_ns, 0)
        span = StepSpan(
            start_ns=start_ns,
            end_ns=now_ns,
            duration_ns=duration_ns,
            compile_ns=compile_ns,
            own_ns=own_ns,
            work_start_ns=min(start_ns + self._boundary_own_ns, now_ns),
            own_in_work_ns=max(own_ns - self._boundary_own_ns, 0),
            phase_ns=self._phase_ns,
        )
        self._start_ns = now_ns
        self._phase_ns = self._own_ns = 0
        self.training_thread = threading.get_ident()
        return span

    def boundary_done(self, now_ns: int) -> None:
        """The hook's work at the boundary ``now_ns`` ends now: all of it was its own (reads of
        ``hook.prediction`` by reporters and callbacks included, hence not an addition)."""
        self._own_ns = self._boundary_own_ns = time.perf_counter_ns() - now_ns

    def _take_compile_ns(self, compiles: CompileWatcher, start_ns: int, end_ns: int) -> int:
        """Compile time in this step outside its phases (those took theirs out). Never raises."""
        try:
            self._compiles_seen = compiles.count
            inside = compiles.compile_ns_in(start_ns, end_ns) - self._compile_ns_in_phases
            self._compile_ns_in_phases = 0
            return min(max(inside, 0), max(end_ns - start_ns - self._phase_ns, 0))
        except Exception:
            return 0
