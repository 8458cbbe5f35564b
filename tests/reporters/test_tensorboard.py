"""reporters.tensorboard: scalars read back from the event files, ranks, laziness, validation."""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("tensorboardX")

from support import run_job

from ets_hook.forecast.forecaster import Forecaster
from ets_hook.forecast.job import JobModel
from ets_hook.reporters.base import ReportDispatcher
from ets_hook.reporters.builder import build_reporters
from ets_hook.reporters.tensorboard import TensorBoardReporter, launcher_rank


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files under ``log_dir``: tag -> [(step, value)]."""
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(log_dir.rglob("events.out.tfevents.*")):
        for tag, points in read_scalars_of(path).items():
            out.setdefault(tag, []).extend(points)
    return out


def read_scalars_of(path: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of one event file: tag -> [(step, value)]."""
    from tensorboardX.proto.event_pb2 import Event

    out: dict[str, list[tuple[int, float]]] = {}
    data = path.read_bytes()
    pos = 0
    while pos < len(data):  # TFRecord: u64 length, u32 crc, payload, u32 crc
        (length,) = struct.unpack("<Q", data[pos : pos + 8])
        event = Event.FromString(data[pos + 12 : pos + 12 + length])
        pos += 12 + length + 4
        for value in event.summary.value:
            out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def test_scalars_are_written_at_the_schedule_and_at_close(tmp_path: Path) -> None:
    reporter = TensorBoardReporter(tmp_path / "tb", rank=0)
    assert reporter.writer is None  # lazy: nothing opened before the first prediction
    f = Forecaster(JobModel(total_steps=400), start_s=0.0, reports=ReportDispatcher([reporter]))
    run_job(f, 300, 0.1)  # 30 s: steps 1, 2, 3, 5, 10, 20, 50, then every 10 s
    f.close()
    scalars = read_scalars(tmp_path / "tb")
    assert set(scalars) == {"ets/iteration_s", "ets/iteration_ci_s", "ets/eta_s", "ets/total_s"}
    steps = [s for s, _ in scalars["ets/iteration_s"]]
    assert steps[:7] == [1, 2, 3, 5, 10, 20, 50]
    assert steps[-1] == 300 and steps == sorted(steps) and 9 <= len(steps) <= 12
    (step, eta), (last_step, last_eta) = scalars["ets/eta_s"][-2:]
    assert step < 300 and eta == pytest.approx((400 - step) * 0.1, rel=0.2)  # while running
    assert (last_step, last_eta) == (300, 0.0)  # closed at step 300: the job ended there
    assert scalars["ets/iteration_s"][-1][1] == pytest.approx(0.1, rel=0.05)


def test_unknown_values_are_skipped_and_a_users_writer_is_not_closed(tmp_path: Path) -> None:
    calls: list[tuple[str, float, int]] = []

    class Writer:
        closed = flushed = 0

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            calls.append((tag, value, step))

        def flush(self) -> None:
            Writer.flushed += 1

        def close(self) -> None:
            Writer.closed += 1

    reporter = TensorBoardReporter(tmp_path / "unused", writer=Writer(), rank=0)
    f = Forecaster(JobModel(total_steps=None), start_s=0.0, reports=ReportDispatcher([reporter]))
    run_job(f, 5, 0.1)
    assert {tag for tag, _, _ in calls} == {"ets/iteration_s", "ets/iteration_ci_s"}
    f.close()  # once ended, its total is what it took
    assert {tag: value for tag, value, _ in calls if tag in ("ets/eta_s", "ets/total_s")} == {
        "ets/eta_s": 0.0,
        "ets/total_s": pytest.approx(0.5, rel=0.05),
    }
    assert Writer.flushed >= 1 and Writer.closed == 0
    assert not (tmp_path / "unused").exists()


def test_a_rank_outside_ranks_opens_nothing(tmp_path: Path) -> None:
    reporter = TensorBoardReporter(tmp_path / "tb", rank=1)
    f = Forecaster(JobModel(total_steps=50), start_s=0.0, reports=ReportDispatcher([reporter]))
    run_job(f, 20, 0.1)
    f.close()
    assert reporter.writer is None and not (tmp_path / "tb").exists()
    every = TensorBoardReporter(tmp_path / "tb-{rank}", ranks=None, rank=3)
    assert every.active and every.log_dir == str(tmp_path / "tb-3")


def test_ranks_writing_one_directory_in_one_second_keep_one_event_file_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tensorboardX names an event file by the second and the host alone: two ranks of one
    host opening their writers in the same second wrote one file, and one rank's series was
    lost. A ``.rank<N>`` suffix keeps them apart where ``log_dir`` has no ``{rank}``."""
    import types

    import tensorboardX.event_file_writer as event_file_writer

    frozen = types.SimpleNamespace(time=lambda: 1_700_000_000.25)  # the same second for both
    monkeypatch.setattr(event_file_writer, "time", frozen)
    log_dir = tmp_path / "tb"
    step_s = {0: 0.1, 1: 0.3}  # rank 1 is 3x slower: the two series tell the ranks apart
    forecasters = []
    for rank in (0, 1):
        reporter = TensorBoardReporter(log_dir, ranks=None, rank=rank)
        assert reporter.filename_suffix == f".rank{rank}"
        f = Forecaster(JobModel(total_steps=40), start_s=0.0, reports=ReportDispatcher([reporter]))
        run_job(f, 3, step_s[rank])  # both writers open (at step 1) before either closes
        forecasters.append(f)
    for f in forecasters:
        f.close()
    files = sorted(p.name for p in log_dir.iterdir())
    assert len(files) == 2 and [name.rsplit(".", 1)[1] for name in files] == ["rank0", "rank1"]
    for rank, name in zip((0, 1), files, strict=True):
        scalars = read_scalars_of(log_dir / name)
        assert {s for s, _ in scalars["ets/iteration_s"]} == {1, 2, 3}  # 3: also at close
        assert scalars["ets/iteration_s"][-1][1] == pytest.approx(step_s[rank], rel=0.05)
    # One rank's directory ({rank} in it), or rank 0 alone: the file names stay tensorboardX's.
    assert TensorBoardReporter(tmp_path / "tb-{rank}", ranks=None, rank=1).filename_suffix == ""
    assert TensorBoardReporter(log_dir, rank=0).filename_suffix == ""


def test_launcher_rank_and_builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert launcher_rank({"RANK": "2"}) == 2 and launcher_rank({"RANK": "x"}) == 0
    monkeypatch.setenv("RANK", "1")
    (reporter,) = build_reporters(log_every_n_steps=None, deadline=False, tensorboard_dir=tmp_path)
    assert isinstance(reporter, TensorBoardReporter) and not reporter.active
    (reporter,) = build_reporters(
        log_every_n_steps=None, deadline=False, tensorboard_dir=tmp_path, rank=0
    )
    assert reporter.active


def test_validation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="tensorboard_dir is a file"):
        TensorBoardReporter(tmp_path / "file")
    with pytest.raises(ValueError, match="dashboard_ranks must be a collection"):
        build_reporters(deadline=False, tensorboard_dir=tmp_path, dashboard_ranks=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ranks must hold ints >= 0"):
        TensorBoardReporter(tmp_path, ranks=(-1,))
    with pytest.raises(ValueError, match="tensorboard_dir must be a path"):
        build_reporters(deadline=False, tensorboard_dir=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rank must be an int"):
        build_reporters(deadline=False, tensorboard_dir=tmp_path, rank=True)
    with pytest.raises(ValueError, match="interval_s must be > 0"):
        TensorBoardReporter(tmp_path, interval_s=0)
    monkeypatch.setattr("ets_hook.reporters.tensorboard._has", lambda module: False)
    with pytest.raises(ImportError, match=r"pip install 'ets-hook\[tensorboard\]'"):
        TensorBoardReporter(tmp_path)


def test_import_and_construction_do_not_import_the_packages(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        import ets_hook
        from ets_hook.reporters.builder import build_reporters
        from ets_hook.reporters.tensorboard import TensorBoardReporter
        TensorBoardReporter({str(tmp_path)!r}, rank=0)
        build_reporters(deadline=False, prometheus_port=9, rank=1)
        heavy = {{"tensorboardX", "tensorboard", "prometheus_client"}} & set(sys.modules)
        assert not heavy, heavy
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
