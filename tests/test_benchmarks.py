"""The benchmark scripts still run against the package (smoke runs on the smallest settings;
their measurements are not asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip


def test_collect_then_capture_priors_on_one_small_job(tmp_path: Path) -> None:
    out = tmp_path / "dataset"
    collected = run(
        "collect.py", "--out", str(out), "--workloads", "mlp-w128-d2-b32",
        "--batch-scales", "1", "--steps", "30",
    )  # fmt: skip
    assert collected.returncode == 0, collected.stderr
    assert len(list(out.glob("*.ets"))) == 1
    priors = run("capture_priors.py", str(out))
    assert priors.returncode == 0, priors.stderr
    assert "native RecordFunction observer" in priors.stdout
    assert "capture_spike_steps" in priors.stdout


def test_scale_run_reports_no_drops_for_a_small_op_count(tmp_path: Path) -> None:
    result = run("scale_ops.py", "--ops-per-step", "3000", "--steps", "8")
    assert result.returncode == 0, result.stderr
    lines = dict(line.strip().split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert int(lines["dropped_records"]) == 0
    assert int(lines["ops_per_step_seen"]) >= 3000 * 0.9


def test_framework_accuracy_quick_run_reports_both_frameworks(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("lightning")
    out_json, out_md = tmp_path / "fw.json", tmp_path / "fw.md"
    result = run(
        "accuracy_frameworks.py", "--quick", "--repeats", "1",
        "--json", str(out_json), "--markdown", str(out_md),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(out_json.read_text())
    assert {r["framework"] for r in document["runs"]} == {"transformers", "lightning"}
    for method in ("ets-hook", "framework", "last_step"):
        assert set(document["summary"][method]) == {"3", "5", "10"}
    assert "| ets-hook (median / max over runs) |" in out_md.read_text()


def test_accuracy_rounds_run_each_job_in_fresh_processes_and_report_per_job(
    tmp_path: Path,
) -> None:
    out = tmp_path / "acc"
    result = run(
        "accuracy.py", "--jobs", "mlp-small", "--steps", "60", "--rounds", "2", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    runs = json.loads(out.with_suffix(".rounds.json").read_text())["mlp-small"]
    assert len(runs) == 2
    # two processes: two independent runs, each scored at the report steps
    assert runs[0]["step_ends_s"] != runs[1]["step_ends_s"]
    for job in runs:
        assert set(job["errors"]["ets-hook"]) == {"1", "2", "3", "5", "10", "20", "50"}
        # the interval of the total is kept, to score its calibration
        assert job["predictions"][4]["total_ci_s"] > 0
    table = out.with_suffix(".rounds.md").read_text()
    assert "| mlp-small | 2 |" in table and "target met at step 5" in table
