"""A real 2-process gloo job under torchrun (``ddp_job.py``), launched once, asserted many ways:
per-rank traces and status files, rank-0-only logs, one job view on both ranks naming the slow
rank, the per-rank table of ``ets-hook info``, no stall when a rank stops calling its hook, and
FSDP2 (``fully_shard``) on CPU behaving per rank as DDP does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from support import ETS_HOOK, free_port

from ets_hook.reporters.status_file import status_schema_path
from ets_hook.trace.io import load_trace

SCRIPT = Path(__file__).with_name("ddp_job.py")
SLOW_RANK = 1


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(SCRIPT),
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def test_each_rank_writes_its_own_trace_with_its_rank(job: Path) -> None:
    for rank in (0, 1):
        trace = load_trace(job / f"trace.rank{rank}.ets")
        assert (trace.rank, trace.world_size) == (rank, 2)
        assert len(trace.iterations) == 5
        assert any(op.name.startswith("c10d::") for it in trace.iterations for op in it.ops)
    assert not (job / "trace.ets").exists()


def test_status_files_job_level_from_rank0_and_one_per_rank(job: Path) -> None:
    schema = json.loads(status_schema_path().read_text())
    job_doc = _json(job / "eta.json")
    rank_docs = [_json(job / f"eta.rank{rank}.json") for rank in (0, 1)]
    for doc in (job_doc, *rank_docs):
        jsonschema.validate(doc, schema)
        assert doc["state"] == "closed" and doc["world_size"] == 2
    assert (job_doc["scope"], job_doc["rank"]) == ("job", 0)
    assert [(d["scope"], d["rank"]) for d in rank_docs] == [("rank", 0), ("rank", 1)]
    assert [d["prediction"]["rank"] for d in rank_docs] == [0, 1]
    assert job_doc["prediction"]["slowest_rank"] == SLOW_RANK


def test_only_rank0_logs_prediction_lines(job: Path) -> None:
    rank0 = (job / "log.rank0.txt").read_text()
    rank1 = (job / "log.rank1.txt").read_text()
    assert "step 1/40" in rank0 and "finished at step 40" in rank0
    assert "step " not in rank1 and "finished" not in rank1


def test_both_ranks_get_the_same_job_view_naming_the_slow_rank(job: Path) -> None:
    results = [_json(job / f"result.rank{rank}.json") for rank in (0, 1)]
    views = [r["view"] for r in results]
    assert views[0] is not None and views[0] == views[1]
    view = views[0]
    assert view["exchange"] == 2 and view["world_size"] == 2
    assert [f["rank"] for f in view["ranks"]] == [0, 1]
    assert view["straggler_rank"] == SLOW_RANK and view["straggler_ratio"] >= 1.1
    assert view["slowest_rank"] == SLOW_RANK
    slow, fast = view["ranks"][SLOW_RANK], view["ranks"][1 - SLOW_RANK]
    assert slow["data_wait_s"] > fast["data_wait_s"] + 0.005  # it sleeps 12 ms per step
    for rank, result in enumerate(results):
        prediction = result["prediction"]
        assert prediction["rank"] == rank and prediction["world_size"] == 2
        assert prediction["slowest_rank"] == SLOW_RANK
        assert prediction["straggler_rank"] == SLOW_RANK
        assert prediction["job_view_step"] == view["step"]
        assert result["exchange_cost_s"] is not None and result["exchange_cost_s"] < 5.0
    # One job: both ranks predict the same end (they were created within a second).
    ends = [r["prediction"]["finish_time"] for r in results]
    from datetime import datetime

    gap_s = abs((datetime.fromisoformat(ends[0]) - datetime.fromisoformat(ends[1])).total_seconds())
    assert gap_s < 0.5


def test_straggler_warning_on_rank0_only(job: Path) -> None:
    rank0 = (job / "log.rank0.txt").read_text()
    assert f"WARNING rank {SLOW_RANK} is a straggler" in rank0
    assert "straggler" not in (job / "log.rank1.txt").read_text()


def test_info_prints_the_per_rank_table(job: Path) -> None:
    done = subprocess.run(
        [ETS_HOOK, "info", str(job / "trace.rank0.ets"), str(job / "trace.rank1.ets")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    table = done.stdout.split("per rank (medians over the captured steps):", 1)[1]
    rows = [line.split() for line in table.strip().splitlines()[1:3]]
    assert [row[0] for row in rows] == ["0", "1"]
    assert f"straggler: rank {SLOW_RANK}" in table
    as_json = subprocess.run(
        [ETS_HOOK, "info", "--json", str(job / "trace.rank0.ets"), str(job / "trace.rank1.ets")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    document = json.loads(as_json.stdout)
    assert document["straggler_rank"] == SLOW_RANK
    assert [r["rank"] for r in document["ranks"]] == [0, 1]


def test_a_rank_that_stops_calling_the_hook_never_stalls_the_others(job: Path) -> None:
    stalled = _json(job / "stall.rank0.json")
    assert len(stalled["step_s"]) == 30
    # The exchange waits on its own thread: no step of rank 0 waited for the 1 s timeout.
    assert max(stalled["step_s"]) < 0.5
    assert stalled["skipped"] >= 1 and stalled["done"] == 0 and stalled["view"] is False
    rank0 = (job / "log.rank0.txt").read_text()
    assert rank0.count("rank exchange") == 1  # one line per hook, not one per exchange
    assert "rank(s) 1 did not report within 1 s" in rank0


def test_fsdp2_on_cpu_behaves_per_rank_as_ddp(job: Path) -> None:
    results = [_json(job / f"fsdp.rank{rank}.json") for rank in (0, 1)]
    assert [r["steps"] for r in results] == [20, 20]
    assert results[0]["view"] is not None and results[0]["view"] == results[1]["view"]
    for rank in (0, 1):
        trace = load_trace(job / f"fsdp.rank{rank}.ets")
        assert (trace.rank, trace.world_size, len(trace.iterations)) == (rank, 2, 3)
        names = {op.name for it in trace.iterations for op in it.ops}
        # FSDP2's all-gather / reduce-scatter are classified as collectives in the breakdown.
        assert {"c10d::_allgather_base_", "c10d::_reduce_scatter_base_"} <= names
