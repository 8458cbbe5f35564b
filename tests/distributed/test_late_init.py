"""A hook created before ``torch.distributed`` is initialised: under
``torch.multiprocessing.spawn`` (no launcher variables) it takes the rank at its first training
forward, as if known at creation (a real 2-process gloo job, ``late_init_job.py``, launched
once); a group initialised only after the first step gets one warning instead."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from support import free_port

from ets_hook import ETSHook
from ets_hook.launcher import LAUNCHER_VARIABLES
from ets_hook.trace.io import load_trace

SCRIPT = Path(__file__).with_name("late_init_job.py")


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("late_init")
    launcher_names = {name for pair in LAUNCHER_VARIABLES for name in pair}
    env = {k: v for k, v in os.environ.items() if k not in launcher_names}
    command = [sys.executable, str(SCRIPT), str(out), str(free_port())]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _result(job: Path, rank: int) -> Any:
    return json.loads((job / f"result.rank{rank}.json").read_text())


def test_each_rank_adopts_its_rank_for_predictions_and_traces(job: Path) -> None:
    for rank in (0, 1):
        result = _result(job, rank)
        assert result["created_trace_name"] == "trace.ets"  # one process at creation
        assert result["trace_name"] == f"trace.rank{rank}.ets"
        prediction = result["prediction"]
        assert (prediction["rank"], prediction["world_size"]) == (rank, 2)
        trace = load_trace(job / f"trace.rank{rank}.ets")
        assert (trace.rank, trace.world_size) == (rank, 2)
    assert not (job / "trace.ets").exists()


def test_the_ranks_exchange_and_share_one_job_view(job: Path) -> None:
    views = [_result(job, rank)["view"] for rank in (0, 1)]
    assert views[0] is not None and views[0] == views[1]
    assert views[0]["world_size"] == 2 and [f["rank"] for f in views[0]["ranks"]] == [0, 1]


def test_status_files_and_logs_as_with_the_rank_known_at_creation(job: Path) -> None:
    job_doc = json.loads((job / "eta.json").read_text())
    assert (job_doc["scope"], job_doc["rank"], job_doc["world_size"]) == ("job", 0, 2)
    for rank in (0, 1):
        doc = json.loads((job / f"eta.rank{rank}.json").read_text())
        assert (doc["scope"], doc["rank"], doc["state"]) == ("rank", rank, "closed")
    rank0 = (job / "log.rank0.txt").read_text()
    rank1 = (job / "log.rank1.txt").read_text()
    assert "it runs as rank 0 of 2" in rank0 and "step 5/12" in rank0
    assert "step " not in rank1
    # No warning about the late rank (a straggler note on these identical 1-2 ms ranks is
    # the machine's noise, not the rank's adoption).
    warnings = [
        line
        for line in (rank0 + rank1).splitlines()
        if "WARNING" in line and "is a straggler" not in line
    ]
    assert warnings == []


def test_a_group_initialised_after_the_first_step_gets_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """By then reporters have acted as rank 0: the hook stays a single process and says how to
    fix it, once."""
    import ets_hook.hook as hook_module

    place = [(0, 1)]
    monkeypatch.setattr(hook_module, "distributed_rank", lambda: place[0])
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    hook = ETSHook(model, optimizer, total_steps=10, capture_steps=0, log_every=None)
    x = torch.randn(4, 8)
    with caplog.at_level(logging.WARNING, logger="ets_hook"):
        for step in range(8):
            if step == 2:
                place[0] = (1, 2)  # init_process_group between steps 1 and 2
            model(x).sum().backward()
            optimizer.step()
    hook.close()
    warnings = [r.getMessage() for r in caplog.records if "initialised after" in r.getMessage()]
    assert len(warnings) == 1
    assert "rank 1 of 2" in warnings[0] and "after init_process_group" in warnings[0]
    prediction = hook.prediction
    assert prediction is not None and (prediction.rank, prediction.world_size) == (0, 1)
