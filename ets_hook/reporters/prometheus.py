"""``PrometheusReporter``: the prediction as Prometheus gauges (``prometheus_client``).

Served on an HTTP endpoint (``port``) or written to a node-exporter textfile-collector file
(``textfile``, ``*.prom``, rewritten atomically). Gauges, each labelled ``job_name`` (default:
the script's name), ``host`` and ``rank`` (plus the user's ``labels``)::

    ets_hook_step                       completed global steps
    ets_hook_total_steps                steps in the whole job (absent while unknown)
    ets_hook_iteration_seconds          steady-state step time
    ets_hook_iteration_ci_seconds       half-width of its 95% interval
    ets_hook_elapsed_seconds            wall time since hook creation
    ets_hook_eta_seconds                wall time still to come (absent while unknown)
    ets_hook_total_seconds              predicted wall time of the job (absent while unknown)
    ets_hook_finish_timestamp_seconds   predicted end, Unix time (absent while unknown)
    ets_hook_converged                  1 once the estimate converged, else 0
    ets_hook_state{state=...}           1 for the current state, 0 for the others
                                        (running, closed, interrupted, failed)

The label is ``job_name``, not ``job``: Prometheus sets ``job`` (and ``instance``) on every
scraped series and would rename ours to ``exported_job``.

``prometheus_client`` (the ``ets-hook[prometheus]`` extra) is imported when the reporter is
built on a rank that reports, never at ``import ets_hook``. Metrics go to a registry of the
reporter's own (not the global one, so two hooks never collide) unless ``registry`` is given.
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import sys
import threading
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..launcher import fill_rank
from ..trace.atomic import atomic_write_bytes
from .base import JOB_OUTCOMES, Reporter
from .tensorboard import _has, dashboard_rank

if TYPE_CHECKING:
    from ..forecast.prediction import Prediction

logger = logging.getLogger("ets_hook")

#: Every value of the ``state`` label of ``ets_hook_state``.
PROMETHEUS_STATES = ("running", *JOB_OUTCOMES)
#: Label names that the reporter sets itself or that the state gauge uses.
DEFAULT_LABELS = ("job_name", "host", "rank")
#: Every gauge's name (``ets_hook_state`` last).
METRIC_NAMES = (
    "ets_hook_step",
    "ets_hook_total_steps",
    "ets_hook_iteration_seconds",
    "ets_hook_iteration_ci_seconds",
    "ets_hook_elapsed_seconds",
    "ets_hook_eta_seconds",
    "ets_hook_total_seconds",
    "ets_hook_finish_timestamp_seconds",
    "ets_hook_converged",
    "ets_hook_state",
)
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_MISSING = (
    "ets-hook's Prometheus reporter needs prometheus_client: pip install 'ets-hook[prometheus]'"
)

# HTTP servers this process started, by (addr, port), with the reporter that owns each: a new
# reporter may take over the port of one that has ended (notebook re-runs), never a live one's.
_servers: dict[tuple[str, int], tuple[Any, PrometheusReporter]] = {}
_servers_lock = threading.RLock()  # re-entrant: reachable from a SIGTERM handler


def script_name() -> str:
    """The running script's name without ``.py`` (``train`` for ``python train.py``, ``pkg``
    for ``python -m pkg``); ``python`` for an interactive session or ``python -c``."""
    arg0 = sys.argv[0] if sys.argv else ""
    if not arg0 or arg0 == "-c":
        return "python"
    path = Path(arg0)
    name = path.parent.name if path.stem == "__main__" else path.stem
    return name or "python"


def _gauges(prediction: Prediction | None) -> list[tuple[str, str, float | None]]:
    """(name, help, value or None) of every gauge but the state."""
    p = prediction
    if p is None:
        return []
    finish = p.finish_time.timestamp() if p.finish_time is not None else None
    return [
        ("ets_hook_step", "Completed training steps (global).", p.step),
        ("ets_hook_total_steps", "Training steps in the whole job.", p.total_steps),
        ("ets_hook_iteration_seconds", "Steady-state time of one training step.", p.iteration_s),
        (
            "ets_hook_iteration_ci_seconds",
            "Half-width of the step time's confidence interval.",
            p.iteration_ci_s,
        ),
        ("ets_hook_elapsed_seconds", "Wall time since the hook was created.", p.elapsed_s),
        ("ets_hook_eta_seconds", "Predicted wall time still to come.", p.eta_s),
        ("ets_hook_total_seconds", "Predicted wall time of the whole job.", p.total_s),
        ("ets_hook_finish_timestamp_seconds", "Predicted end of the job, Unix time.", finish),
        ("ets_hook_converged", "1 once the step-time estimate converged.", float(p.converged)),
    ]


class _Collector:
    """Builds the metric families from the reporter's latest (prediction, state) at collect."""

    def __init__(self, reporter: PrometheusReporter) -> None:
        self.reporter = reporter

    def describe(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        for name in METRIC_NAMES:
            yield GaugeMetricFamily(name, name, labels=self.reporter.label_names)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        prediction, state = self.reporter.snapshot
        names, values = self.reporter.label_names, self.reporter.label_values
        for name, doc, value in _gauges(prediction):
            if value is None or not math.isfinite(float(value)):
                continue
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(values, float(value))
            yield family
        family = GaugeMetricFamily(
            "ets_hook_state",
            "1 for the job's current state (running, closed, interrupted, failed).",
            labels=[*names, "state"],
        )
        for s in PROMETHEUS_STATES:
            family.add_metric([*values, s], 1.0 if s == state else 0.0)
        yield family


class PrometheusReporter(Reporter):
    """Exports the prediction as Prometheus gauges (see the module docstring for the list).

    Schedule: the first prediction, the early local steps (``EARLY_STEPS``) and then every
    ``interval_s`` seconds (10 s by default: Prometheus scrapes every 15-60 s, so fresher
    values would not be seen). With ``port``, the HTTP server starts on the first prediction
    (a daemon thread that keeps serving the final values after the job ends, until the process
    exits or a later reporter of this process takes the port over); a port already in use
    logs one warning naming it and this rank and turns the reporter off, never raising into
    training. With
    ``textfile``, the file is rewritten atomically at each due prediction and at the end; a
    failed write is logged (once per run of failures) and retried at the next one.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        textfile: str | os.PathLike[str] | None = None,
        ranks: Collection[int] | None = (0,),
        registry: Any = None,
        labels: Mapping[str, str] | None = None,
        addr: str = "0.0.0.0",
        interval_s: float | None = 10.0,
        rank: int | None = None,
    ) -> None:
        """Validate the arguments; on a reporting rank, register the gauges. Opens nothing.

        Args:
            port: TCP port (1-65535) of an HTTP endpoint serving ``/metrics``.
            textfile: a node-exporter textfile-collector file: its name ends in ``.prom``, its
                folder exists; ``{rank}`` in it is replaced by the rank.
            ranks: ranks that export (ints >= 0); None: every rank. Elsewhere the reporter does
                nothing (no import, no port, no file).
            registry: a ``prometheus_client`` ``CollectorRegistry`` to register the gauges in
                (then ``port`` and ``textfile`` may both be None: the caller exports it); None:
                a registry of our own.
            labels: extra labels (or replacements of ``job_name``, ``host``, ``rank``) on every
                gauge: valid Prometheus label names, not ``state`` nor starting with ``__``;
                string values.
            addr: address the HTTP endpoint binds (``"0.0.0.0"``: every interface).
            interval_s: seconds (> 0) between exports after the early steps; None: early steps
                only.
            rank: this process's rank; None: ``launcher_rank()`` (the ``RANK`` variable).

        Raises:
            ValueError: both ``port`` and ``textfile`` given, or neither without ``registry``;
                ``port`` not an int in 1-65535; ``textfile`` not ending in ``.prom``, in a
                missing folder or a directory; a bad label name or value; ``ranks`` or
                ``rank`` not ints >= 0; ``interval_s`` not > 0; the registry already holds
                ets-hook's gauges with these names.
            ImportError: prometheus_client is not installed (the message names
                ``pip install 'ets-hook[prometheus]'``).
        """
        if port is not None and textfile is not None:
            raise ValueError(
                f"give prometheus_port or prometheus_textfile, not both (got {port!r}, "
                f"{os.fspath(textfile)!r})"
            )
        if port is None and textfile is None and registry is None:
            raise ValueError("PrometheusReporter needs a port, a textfile or a registry")
        if port is not None and (
            isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535
        ):
            raise ValueError(f"prometheus_port must be an int in 1-65535, got {port!r}")
        self.ranks, self.rank, self.active, self.schedule = dashboard_rank(ranks, rank, interval_s)
        rank = self.rank
        self.port, self.addr = port, addr
        self.textfile = Path(fill_rank(textfile, rank)) if textfile is not None else None
        if self.textfile is not None:
            if not self.textfile.name.endswith(".prom"):
                raise ValueError(
                    f"prometheus_textfile must end in .prom (node-exporter reads only those), "
                    f"got {self.textfile}"
                )
            if not self.textfile.parent.is_dir():
                raise ValueError(
                    f"prometheus_textfile's directory does not exist: {self.textfile.parent}"
                )
            if self.textfile.is_dir():
                raise ValueError(f"prometheus_textfile is a directory: {self.textfile}")
        merged = {"job_name": script_name(), "host": socket.gethostname(), "rank": str(rank)}
        for name, value in (labels or {}).items():
            if (
                not isinstance(name, str)
                or not _LABEL_NAME.match(name)
                or name.startswith("__")
                or name == "state"
            ):
                raise ValueError(f"labels: invalid Prometheus label name {name!r}")
            if not isinstance(value, str):
                raise ValueError(f"labels: the value of {name!r} must be a str, got {value!r}")
            merged[name] = value
        self.label_names = list(merged)
        self.label_values = list(merged.values())
        self.snapshot: tuple[Prediction | None, str] = (None, "running")
        self.ended = False
        self._server: Any = None
        self._off = False
        self._write_failing = False
        self.registry: Any = registry
        if not _has("prometheus_client"):
            raise ImportError(_MISSING)
        if self.active:
            from prometheus_client import CollectorRegistry

            if self.registry is None:
                self.registry = CollectorRegistry(auto_describe=True)
            self.registry.register(_Collector(self))

    @property
    def server_port(self) -> int | None:
        """The port the HTTP endpoint listens on, or None while it is not serving."""
        return self._server.server_port if self._server is not None else None

    def metrics_text(self) -> bytes:
        """The registry in the Prometheus text format (what the endpoint and the file hold).

        Raises:
            RuntimeError: on a rank that does not report (no registry).
        """
        if self.registry is None:
            raise RuntimeError("this rank does not export Prometheus metrics")
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def on_prediction(self, prediction: Prediction) -> None:
        """Export the prediction (starting the HTTP server on the first call); off-rank: nothing."""
        if not self.active or self._off:
            return
        self.snapshot = (prediction, "running")
        self._export()

    def on_close(self, prediction: Prediction | None) -> None:
        """Export the final values with state ``closed``."""
        self.on_end(prediction, "closed", None)

    def on_end(self, prediction: Prediction | None, outcome: str, error: str | None) -> None:
        """Set the state gauge to ``outcome``; rewrite the textfile (an HTTP endpoint serves the
        final values from now on; none is started at the end if none was running)."""
        self.ended = True
        if not self.active or self._off:
            return
        if prediction is None:
            prediction = self.snapshot[0]
        self.snapshot = (prediction, outcome)
        if self.textfile is not None:
            self._write_textfile()

    def _export(self) -> None:
        if self.textfile is not None:
            self._write_textfile()
        elif self.port is not None and self._server is None:
            self._serve()

    def _write_textfile(self) -> None:
        assert self.textfile is not None
        try:
            atomic_write_bytes(self.textfile, self.metrics_text(), fsync=False)
        except OSError as exc:
            if not self._write_failing:
                logger.warning(
                    "cannot write the Prometheus textfile %s (%s); retrying at the next prediction",
                    self.textfile,
                    exc,
                )
            self._write_failing = True
            return
        if self._write_failing:
            logger.info("Prometheus textfile %s written again", self.textfile)
        self._write_failing = False

    def _serve(self) -> None:
        from prometheus_client import start_http_server

        assert self.port is not None
        key = (self.addr, self.port)
        with _servers_lock:
            previous = _servers.get(key)
            if previous is not None and previous[1].ended:
                _servers.pop(key)
                previous[0].shutdown()
                previous[0].server_close()
            try:
                server, _ = start_http_server(self.port, self.addr, registry=self.registry)
            except OSError as exc:
                self._off = True
                logger.warning(
                    "rank %d cannot serve Prometheus metrics on port %d (%s); its Prometheus "
                    "reporter is off",
                    self.rank,
                    self.port,
                    exc,
                )
                return
            _servers[key] = (server, self)
        self._server = server
