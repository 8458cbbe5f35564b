"""reporters.prometheus: textfile and HTTP endpoint parsed back, ports in use, ranks."""

from __future__ import annotations

import logging
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from support import run_job

from ets_hook.forecast.forecaster import Forecaster
from ets_hook.forecast.job import JobModel
from ets_hook.reporters.base import ReportDispatcher
from ets_hook.reporters.builder import build_reporters
from ets_hook.reporters.prometheus import (
    METRIC_NAMES,
    PROMETHEUS_STATES,
    PrometheusReporter,
    _servers,
)


def samples(text: str) -> dict[str, list[Any]]:
    """Parsed exposition text: metric family name -> its samples."""
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(parsed: dict[str, list[Any]], name: str) -> float:
    (sample,) = parsed[name]
    return float(sample.value)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def drive(reporter: PrometheusReporter, n: int = 50, total: int | None = 100) -> Forecaster:
    f = Forecaster(JobModel(total_steps=total), start_s=0.0, reports=ReportDispatcher([reporter]))
    run_job(f, n, 0.1)
    return f


@pytest.mark.parametrize(("outcome", "error"), [("closed", None), ("failed", "RuntimeError")])
def test_textfile_is_parsed_back(tmp_path: Path, outcome: str, error: str | None) -> None:
    path = tmp_path / "ets.prom"
    reporter = PrometheusReporter(textfile=path, rank=0, labels={"team": "vision"})
    f = drive(reporter)
    running = samples(path.read_text())
    states = {s.labels["state"]: s.value for s in running["ets_hook_state"]}
    assert states == {"running": 1.0, "closed": 0.0, "interrupted": 0.0, "failed": 0.0}
    assert value(running, "ets_hook_step") == 50  # early steps ..., 20, 50
    assert value(running, "ets_hook_total_steps") == 100
    assert value(running, "ets_hook_iteration_seconds") == pytest.approx(0.1, rel=0.1)
    assert value(running, "ets_hook_eta_seconds") == pytest.approx(5.0, rel=0.2)
    assert value(running, "ets_hook_finish_timestamp_seconds") > 1.6e9
    labels = running["ets_hook_step"][0].labels
    assert labels["rank"] == "0" and labels["team"] == "vision"
    assert labels["host"] == socket.gethostname() and labels["job_name"] == "pytest"
    assert set(running) == set(METRIC_NAMES)
    f.close(outcome, error)
    final = samples(path.read_text())
    states = {s.labels["state"]: s.value for s in final["ets_hook_state"]}
    assert states[outcome] == 1.0 and sum(states.values()) == 1.0
    assert set(states) == set(PROMETHEUS_STATES)
    assert value(final, "ets_hook_step") == 50
    if outcome == "closed":  # the job ended at step 50: what ran, not the plan
        assert value(final, "ets_hook_total_steps") == 50
        assert value(final, "ets_hook_eta_seconds") == 0.0
    else:  # a failed job may be resumed: the projection of the whole run stays
        assert value(final, "ets_hook_total_steps") == 100
        assert value(final, "ets_hook_eta_seconds") == pytest.approx(5.0, rel=0.2)


def test_unknown_values_are_absent_and_own_registries_do_not_collide(tmp_path: Path) -> None:
    a = PrometheusReporter(textfile=tmp_path / "a.prom", rank=0)
    b = PrometheusReporter(textfile=tmp_path / "b.prom", rank=0)  # a second hook: no clash
    forecaster = drive(a, 5, total=None)
    parsed = samples((tmp_path / "a.prom").read_text())
    assert "ets_hook_eta_seconds" not in parsed and "ets_hook_total_steps" not in parsed
    assert value(parsed, "ets_hook_step") == 5
    forecaster.close()  # once the job has ended, its length is known
    final = samples((tmp_path / "a.prom").read_text())
    assert value(final, "ets_hook_total_steps") == 5 and value(final, "ets_hook_eta_seconds") == 0
    assert b.registry is not a.registry
    shared = CollectorRegistry()
    PrometheusReporter(registry=shared, rank=0)
    with pytest.raises(ValueError, match="Duplicated"):
        PrometheusReporter(registry=shared, rank=0)


def test_http_endpoint_is_scraped_and_a_port_in_use_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    reporter = PrometheusReporter(port=port, addr="127.0.0.1", rank=0)
    assert reporter.server_port is None  # started on the first prediction
    f = drive(reporter)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            parsed = samples(response.read().decode())
        assert value(parsed, "ets_hook_step") == 50
        # A second live reporter on the same port: one warning naming it, no exception.
        other = PrometheusReporter(port=port, addr="127.0.0.1", rank=0)
        with caplog.at_level(logging.WARNING, logger="ets_hook"):
            g = drive(other, 60)
            g.close()
        warnings = [r.getMessage() for r in caplog.records if "Prometheus" in r.getMessage()]
        assert len(warnings) == 1 and str(port) in warnings[0]
        f.close("interrupted")
        with urllib.request.urlopen(url, timeout=5) as response:  # the final values
            final = samples(response.read().decode())
        states = {s.labels["state"]: s.value for s in final["ets_hook_state"]}
        assert states["interrupted"] == 1.0
        # A later reporter of this process takes over the port of one that ended.
        later = PrometheusReporter(port=port, addr="127.0.0.1", rank=0)
        h = drive(later, 3)
        assert later.server_port == port
        with urllib.request.urlopen(url, timeout=5) as response:
            assert value(samples(response.read().decode()), "ets_hook_step") == 3
        h.close()
    finally:
        server, _ = _servers.pop(("127.0.0.1", port))
        server.shutdown()
        server.server_close()


def test_a_port_in_use_names_the_rank_that_cannot_serve_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With dashboard_ranks=None and one port, the second rank of a host finds it taken: its
    warning says which rank it is, not only which port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        reporter = PrometheusReporter(port=port, addr="127.0.0.1", ranks=None, rank=1)
        with caplog.at_level(logging.WARNING, logger="ets_hook"):
            drive(reporter, 5).close()
    [warning] = [r.getMessage() for r in caplog.records if "Prometheus" in r.getMessage()]
    assert warning.startswith(f"rank 1 cannot serve Prometheus metrics on port {port} (")
    assert reporter.server_port is None


def test_a_rank_outside_ranks_opens_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    port = free_port()
    (reporter,) = build_reporters(
        log_every_n_steps=None, deadline=False, prometheus_port=port, dashboard_ranks=(0,)
    )
    assert isinstance(reporter, PrometheusReporter) and not reporter.active
    drive(reporter).close()
    assert reporter.registry is None and reporter.server_port is None
    with socket.socket() as s:  # the port is still free
        s.bind(("127.0.0.1", port))
    (quiet,) = build_reporters(
        log_every_n_steps=None, deadline=False, prometheus_textfile=tmp_path / "m.prom", rank=1
    )
    drive(quiet).close()
    assert not (tmp_path / "m.prom").exists()


def test_validation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="not both"):
        build_reporters(deadline=False, prometheus_port=9100, prometheus_textfile="x.prom")
    with pytest.raises(ValueError, match="needs a port, a textfile or a registry"):
        PrometheusReporter()
    for port in (0, 70000, True, "9100"):
        with pytest.raises(ValueError, match="prometheus_port must be an int"):
            build_reporters(deadline=False, prometheus_port=port)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"must end in \.prom"):
        PrometheusReporter(textfile=tmp_path / "m.txt")
    with pytest.raises(ValueError, match="directory does not exist"):
        PrometheusReporter(textfile=tmp_path / "missing" / "m.prom")
    (tmp_path / "d.prom").mkdir()
    with pytest.raises(ValueError, match="is a directory"):
        PrometheusReporter(textfile=tmp_path / "d.prom")
    for labels in ({"state": "x"}, {"__x": "y"}, {"bad-name": "y"}, {"ok": 1}):
        with pytest.raises(ValueError, match="labels"):
            PrometheusReporter(textfile=tmp_path / "m.prom", labels=labels)  # type: ignore[arg-type]
    monkeypatch.setattr("ets_hook.reporters.prometheus._has", lambda module: False)
    with pytest.raises(ImportError, match=r"pip install 'ets-hook\[prometheus\]'"):
        PrometheusReporter(textfile=tmp_path / "m.prom")


def test_a_failed_textfile_write_is_logged_once_and_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.prom"
    reporter = PrometheusReporter(textfile=path, rank=0)

    def fail(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("ets_hook.reporters.prometheus.atomic_write_bytes", fail)
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        f = drive(reporter)
    assert [r.getMessage() for r in caplog.records].count(
        f"cannot write the Prometheus textfile {path} (disk full); retrying at the next prediction"
    ) == 1
    monkeypatch.undo()
    f.close()
    assert value(samples(path.read_text()), "ets_hook_step") == 50
