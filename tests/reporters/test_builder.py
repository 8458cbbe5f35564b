"""reporters.builder: argument validation and which reporters are built."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from support import run_job

from ets_hook.forecast.forecaster import Forecaster
from ets_hook.forecast.job import JobModel
from ets_hook.reporters.base import ReportDispatcher, Reporter
from ets_hook.reporters.builder import build_reporters
from ets_hook.reporters.deadline import (
    DeadlineGuard,
)
from ets_hook.reporters.log import LogReporter
from ets_hook.reporters.status_file import StatusFileReporter
from ets_hook.reporters.tqdm import TqdmReporter


def test_build_reporters_validates() -> None:
    with pytest.raises(ValueError, match="on_prediction must be callable"):
        build_reporters(on_prediction=42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_deadline must be"):
        build_reporters(deadline=False, on_deadline="shout")
    kinds = [type(r) for r in build_reporters(deadline=60.0, environ={})]
    assert kinds == [LogReporter, DeadlineGuard]


# ---------------------------------------------------------------------------------------------
# Multi-process jobs: per-rank status files and log_ranks


def _quiet(**kwargs: Any) -> list[Reporter]:
    defaults: dict[str, Any] = {"deadline": False, "environ": {}, "verbose": False}
    return build_reporters(**{**defaults, **kwargs})


def _run_to_close(reporters: list[Reporter], rank: int, world_size: int) -> None:
    f = Forecaster(
        JobModel(total_steps=30),
        start_s=0.0,
        reports=ReportDispatcher(reporters),
        rank=rank,
        world_size=world_size,
    )
    run_job(f, 10, 0.1)
    f.close()


@pytest.mark.parametrize("rank", [1, 3])
def test_a_rank_other_than_0_writes_only_its_own_status_file(tmp_path: Path, rank: int) -> None:
    reporters = _quiet(status_path=tmp_path / "eta.json", rank=rank, world_size=4)
    status = [r for r in reporters if isinstance(r, StatusFileReporter)]
    assert [(r.path, r.scope, r.rank, r.world_size) for r in status] == [
        (tmp_path / f"eta.rank{rank}.json", "rank", rank, 4)
    ]
    _run_to_close(reporters, rank, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"eta.rank{rank}.json"]
    doc = json.loads((tmp_path / f"eta.rank{rank}.json").read_text())
    assert (doc["scope"], doc["rank"], doc["world_size"], doc["state"]) == (
        "rank",
        rank,
        4,
        "closed",
    )


def test_rank_0_writes_the_jobs_file_and_its_own(tmp_path: Path) -> None:
    reporters = _quiet(status_path=tmp_path / "eta.json", rank=0, world_size=2)
    _run_to_close(reporters, 0, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eta.json", "eta.rank0.json"]
    scopes = {
        name: json.loads((tmp_path / name).read_text())["scope"]
        for name in ("eta.json", "eta.rank0.json")
    }
    assert scopes == {"eta.json": "job", "eta.rank0.json": "rank"}


def test_a_single_process_writes_the_given_file_only(tmp_path: Path) -> None:
    reporters = _quiet(status_path=tmp_path / "eta.json", rank=0)
    _run_to_close(reporters, 0, 1)
    assert [p.name for p in tmp_path.iterdir()] == ["eta.json"]
    assert json.loads((tmp_path / "eta.json").read_text())["scope"] == "job"


def test_a_rank_beyond_world_size_widens_the_world(tmp_path: Path) -> None:
    [status] = [
        r
        for r in _quiet(status_path=tmp_path / "eta.json", rank=2, world_size=1)
        if isinstance(r, StatusFileReporter)
    ]
    assert (status.path.name, status.rank, status.world_size) == ("eta.rank2.json", 2, 3)


def _kinds(reporters: list[Reporter]) -> list[type]:
    return [type(r) for r in reporters]


def test_log_ranks_decide_who_logs_and_shows_its_own_bar() -> None:
    assert _kinds(_quiet(rank=1, progress=True)) == []
    assert _kinds(_quiet(rank=0, progress=True)) == [LogReporter, TqdmReporter]
    assert _kinds(_quiet(rank=1, progress=True, log_ranks=(1, 2))) == [LogReporter, TqdmReporter]
    assert _kinds(_quiet(rank=0, progress=True, log_ranks=[2])) == []
    for rank in (0, 5):
        assert _kinds(_quiet(rank=rank, progress=True, log_ranks=None)) == [
            LogReporter,
            TqdmReporter,
        ]


@pytest.mark.parametrize(
    ("rank", "world_size", "log_ranks", "prefix"),
    [
        (0, 2, (0,), ""),  # the default: rank 0 alone logs, as a single process would
        (0, 1, None, ""),  # a single process
        (0, 2, None, "rank 0 · "),  # every rank logs: each line says whose it is
        (1, 2, None, "rank 1 · "),
        (1, 2, (1,), "rank 1 · "),  # not rank 0: said, though it logs alone
    ],
)
def test_lines_name_their_rank_where_any_rank_but_0_logs(
    caplog: pytest.LogCaptureFixture, rank: int, world_size: int, log_ranks: Any, prefix: str
) -> None:
    [log] = [
        r
        for r in _quiet(rank=rank, world_size=world_size, log_ranks=log_ranks)
        if isinstance(r, LogReporter)
    ]
    f = Forecaster(JobModel(total_steps=10), start_s=0.0, reports=ReportDispatcher([log]))
    with caplog.at_level(logging.INFO, logger="ets_hook"):
        run_job(f, 10, 0.1, on_step=lambda step, now: f.prediction)
        f.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "ets_hook"]
    assert lines and lines[-1].startswith(f"{prefix}finished at step 10")
    assert all(line.startswith(f"{prefix}step ") for line in lines[:-1])


def test_a_users_bar_is_annotated_on_every_rank() -> None:
    class Bar:
        def set_postfix_str(self, text: str, refresh: bool = True) -> None:
            pass

    assert _kinds(_quiet(rank=1, progress=Bar())) == [TqdmReporter]


def test_the_launchers_rank_is_used_when_none_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _kinds(_quiet(environ={"RANK": "1"})) == []
    assert _kinds(_quiet(environ={"SLURM_PROCID": "0"})) == [LogReporter]
    monkeypatch.setenv("RANK", "1")  # environ=None reads os.environ
    assert _kinds(_quiet(environ=None, deadline=False)) == []


@pytest.mark.parametrize("log_ranks", [1, "0", [True], [-1], (0, 1.0)])
def test_log_ranks_are_checked(log_ranks: Any) -> None:
    with pytest.raises(ValueError, match="log_ranks"):
        _quiet(rank=0, log_ranks=log_ranks)


@pytest.mark.parametrize("world_size", [0, -1, True, 2.0, "2"])
def test_world_size_is_checked(world_size: Any) -> None:
    with pytest.raises(ValueError, match="world_size"):
        _quiet(rank=0, world_size=world_size)


# ---------------------------------------------------------------------------------------------
# Dashboards that several ranks would open in one place


def _shared_warnings(caplog: pytest.LogCaptureFixture, **kwargs: Any) -> list[str]:
    """The ``"ets_hook"`` warnings of one ``build_reporters`` call about shared dashboards."""
    pytest.importorskip("tensorboardX")
    pytest.importorskip("prometheus_client")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        _quiet(log_every_n_steps=None, **kwargs)
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "ets_hook" and "dashboard_ranks" in r.getMessage()
    ]


@pytest.mark.parametrize("option", ["tensorboard_dir", "prometheus_textfile", "prometheus_port"])
def test_every_rank_opening_one_dashboard_warns_once_naming_the_option_and_the_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, option: str
) -> None:
    value: Any = {
        "tensorboard_dir": tmp_path / "tb",
        "prometheus_textfile": tmp_path / "ets.prom",
        "prometheus_port": 9471,
    }[option]
    [warning] = _shared_warnings(
        caplog, rank=0, world_size=2, dashboard_ranks=None, **{option: value}
    )
    assert f"{option}=" in warning and "dashboard_ranks=None" in warning
    assert "leave dashboard_ranks at its default" in warning
    if option != "prometheus_port":
        assert "put {rank} in it" in warning
    # The other ranks stay quiet: one warning per job, not one per rank.
    assert (
        _shared_warnings(caplog, rank=1, world_size=2, dashboard_ranks=None, **{option: value})
        == []
    )


def test_dashboards_that_ranks_do_not_share_do_not_warn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tb, prom = tmp_path / "tb-{rank}", tmp_path / "ets.{rank}.prom"
    for kwargs in (
        {"tensorboard_dir": tb, "dashboard_ranks": None},  # one directory per rank
        {"prometheus_textfile": prom, "dashboard_ranks": None},
        {"tensorboard_dir": tmp_path / "tb"},  # the default: rank 0 alone
        {"prometheus_port": 9471, "dashboard_ranks": (0, 7)},  # rank 7 is not in the job
    ):
        assert _shared_warnings(caplog, rank=0, world_size=4, **kwargs) == [], kwargs
    # A single process, a disabled hook (ETS_HOOK_DISABLE: it opens nothing and says
    # nothing), or a check before any hook exists (configure_logging=False): none.
    assert _shared_warnings(caplog, rank=0, tensorboard_dir=tmp_path, dashboard_ranks=None) == []
    disabled = {"warn_shared_dashboards": False}
    assert (
        _shared_warnings(
            caplog, rank=0, world_size=2, tensorboard_dir=tmp_path, dashboard_ranks=None, **disabled
        )
        == []
    )
    assert (
        _shared_warnings(
            caplog,
            rank=0,
            world_size=2,
            prometheus_port=9471,
            dashboard_ranks=None,
            configure_logging=False,
        )
        == []
    )


def test_the_first_rank_that_opens_dashboards_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kwargs: dict[str, Any] = {"tensorboard_dir": tmp_path, "dashboard_ranks": (2, 3)}
    assert _shared_warnings(caplog, rank=0, world_size=4, **kwargs) == []
    [warning] = _shared_warnings(caplog, rank=2, world_size=4, **kwargs)
    assert "dashboard_ranks=[2, 3] makes 2 ranks open the same dashboard" in warning
    assert _shared_warnings(caplog, rank=3, world_size=4, **kwargs) == []
