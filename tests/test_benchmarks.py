"""The benchmark scripts still run against the package (smoke runs on the smallest settings;
their measurements are not asserted here)."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch
from support import SHARED_DATA

from ets_hook.forecast.epochs import SEED_TO_LATER_START

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@cache
def benchmark(name: str) -> Any:
    """benchmarks/<name>.py as a module (benchmarks/ is no package), registered under its name:
    dataclasses look their module up, and the scripts import each other by name."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def accuracy() -> Any:
    """benchmarks/accuracy.py as a module."""
    return benchmark("accuracy")


def frameworks_benchmark() -> Any:
    """benchmarks/accuracy_frameworks.py as a module (it imports ``accuracy``)."""
    accuracy()
    return benchmark("accuracy_frameworks")


def run(
    script: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env,
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


def test_collect_runs_the_variant_loops_as_their_own_families_then_trains_on_them(
    tmp_path: Path,
) -> None:
    from ets_hook.forecast.trace_estimators import fit_early_schema, training_example
    from ets_hook.trace.io import load_trace

    out = tmp_path / "dataset"
    jobs = (
        "mlp-w128-d2-b32+loader-w0,mlp-w128-d2-b32+loader-w2,"
        "transformer-d64-l2-b16-t32+varlen,gpt-d64-l2-b8-t64+accum2"
    )
    collected = run(
        "collect.py", "--out", str(out), "--workloads", jobs, "--batch-scales", "0.25",
        "--steps", "30",
    )  # fmt: skip
    assert collected.returncode == 0, collected.stderr
    traces = {t.metadata["workload"]: t for t in map(load_trace, sorted(out.glob("*.ets")))}
    assert set(traces) == {
        "mlp-w128-d2-b8+loader-w0", "mlp-w128-d2-b8+loader-w2",
        "transformer-d64-l2-b4-t32+varlen", "gpt-d64-l2-b2-t64+accum2",
    }  # fmt: skip
    md = {name: t.metadata for name, t in traces.items()}
    assert md["mlp-w128-d2-b8+loader-w2"]["family"] == "mlp-loader"
    assert md["mlp-w128-d2-b8+loader-w2"]["loader"]["num_workers"] == 2
    assert md["gpt-d64-l2-b2-t64+accum2"]["grad_accum"] == 2
    varlen = md["transformer-d64-l2-b4-t32+varlen"]
    assert varlen["family"] == "transformer-varlen" and varlen["steady_statistic"] == "fmean"
    assert varlen["steps"] == 200 and len(varlen["step_times_s"]) > 30  # its own length
    # the in-process loader's ops are input, not model rows: its data wait is the lead-in
    w0 = traces["mlp-w128-d2-b8+loader-w0"]
    assert any(op.phase.value == "input" for op in w0.iterations[0].ops)
    schema = fit_early_schema(list(traces.values()))
    example = training_example(w0, schema)
    # (Not compared with the model rows' time: under load either can be the longer.) Were the
    # input ops rows, the lead-in would end at the first of them, before their time.
    input_ns = [
        sum(op.duration_ns for op in it.ops if op.phase.value == "input" and op.depth == 0)
        for it in w0.iterations
    ]
    assert example.summary.lead_in_ns >= statistics.median(input_ns) > 0
    trained = run(
        "train_early_model.py", str(out), "--kinds", "lstm", "--epochs", "1",
        "--shipped", str(ROOT / "ets_hook" / "data" / "early_cpu.npz"),
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert "| mlp-loader (new) | 2 |" in trained.stdout and "new MRE" in trained.stdout


def test_scale_run_reports_no_drops_for_a_small_op_count(tmp_path: Path) -> None:
    result = run("scale_ops.py", "--ops-per-step", "3000", "--steps", "8")
    assert result.returncode == 0, result.stderr
    lines = dict(line.strip().split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert int(lines["dropped_records"]) == 0
    assert int(lines["ops_per_step_seen"]) >= 3000 * 0.9


def test_decode_cost_times_every_stage_of_a_real_window() -> None:
    result = run("decode_cost.py", "--workloads", "mlp-w128-d2-b32", "--repeats", "2")
    assert result.returncode == 0, result.stderr
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("mlp-w128-d2-b32:")]
    ops = int(line.split(": ", 1)[1].split(" ops", 1)[0])
    assert ops >= 5 * 150  # ~200 ops per step of this MLP, 5 steps
    for stage in ("read", "build_iterations", "estimate"):
        assert f" {stage} " in line


def test_decode_lost_time_reports_the_decode_beside_the_prior() -> None:
    result = run(
        "decode_cost.py", "--lost-time", "--repeats", "1", "--workloads", "mlp-w128-d2-b32"
    )
    assert result.returncode == 0, result.stderr
    (row,) = [x.split() for x in result.stdout.splitlines() if x.startswith("mlp-w128-d2-b32 ")]
    ops, decode_wall_ms, lost_ms = int(row[1]), float(row[3]), float(row[5])
    assert ops >= 5 * 50 and decode_wall_ms > 0
    low, high = (float(x) for x in row[6].split("-"))
    assert low < high  # the prior's range for these ops
    assert float(row[7]) == pytest.approx(2 * lost_ms / (low + high), rel=0.05, abs=0.02)
    assert "lost / the prior's midpoint: median" in result.stdout


def test_allocator_faults_reports_each_epoch_of_each_variant(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("lightning")
    # Each variant's one fit (what a child process of the script runs), in this process: the
    # script's fresh processes are for the measurement, not for its output's shape.
    frameworks_benchmark()  # the model and module its fit imports
    bench = benchmark("allocator_faults")
    for variant in ("bare", "hook"):
        argv = ["--one", variant, "--batches", "2", "--epochs", "2", "--batch-size", "8"]
        assert bench.main(argv) == 0
    out = capsys.readouterr().out
    runs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["hook"] for r in runs] == [False, True]
    for r in runs:
        assert len(r["faults_per_step"]) == len(r["cpu_ms_per_step"]) == 2
        assert all(f >= 0 for f in r["faults_per_step"])
        assert all(ms > 0 for ms in r["cpu_ms_per_step"])


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
    for method in ("ets-hook", "framework", "last_step", "ets-hook unpriced"):
        assert set(document["summary"][method]) == {"3", "5", "10"}
    assert "| ets-hook (median / max over runs) |" in out_md.read_text()
    # The evaluations were priced at step 3 and measured by the end.
    hf = next(r for r in document["runs"] if r["framework"] == "transformers")
    assert hf["phases_early"]["eval"]["source"] == "prior"
    assert hf["phases_final"]["eval"]["occurrences"] >= 1
    assert set(document["target"]) == {"floor_pct", "limit_pct", "step5_pct", "below_bar", "met"}
    assert "**Target**" in out_md.read_text()
    assert "| eval |" in out_md.read_text()


@pytest.mark.parametrize("loop", ["plain", "transformers"])
def test_epoch_starts_measures_the_seed_and_the_later_start_ups_in_one_run(loop: str) -> None:
    if loop == "transformers":
        pytest.importorskip("transformers")
    frameworks_benchmark()  # its datasets (and ``accuracy``'s), under their module names
    bench = benchmark("epoch_starts")
    runner = bench.one_trainer_run if loop == "transformers" else bench.one_run
    run = runner(workers=1, epochs=3, steps_per_epoch=8, batch=8)
    # the loader's own times where the loop is ours; the Trainer owns its loop
    assert (
        len(run["first_batch_s"]) == len(run["stop_iteration_s"]) == (3 if loop == "plain" else 0)
    )
    assert run["seed_s"] > 0 and run["later_mean_s"] > 0
    assert run["later_over_seed"] == pytest.approx(run["later_mean_s"] / run["seed_s"])
    low, high = SEED_TO_LATER_START
    assert run["price_at_step_5_s"] == pytest.approx(run["seed_s"] * (low + high) / 2)


def test_framework_target_allows_the_runs_drift_floor_and_needs_the_bar_beaten() -> None:
    bench = frameworks_benchmark()
    steps = 100

    def record(drift: float, ours: float, bar: float) -> Any:
        # steps 20..49 run (1 + drift) x the second half's 1 s: the run's own drift floor
        times = [1.0 + drift if 20 <= i < 50 else 1.0 for i in range(steps)]
        ends = list(itertools.accumulate(times))
        truth = ends[-1]
        r = bench.Record("constructed", "lightning", 0, steps, step_ends_s=ends,
                         train_step_s=times, job_end_s=truth)  # fmt: skip
        for k in bench.REPORT_STEPS:
            r.ets_total_s[k] = truth * (1 + ours)
            r.framework_total_s[k] = truth * (1 - bar)
        return r

    def judged(records: list[Any]) -> dict[str, Any]:
        return bench.verdict(records, bench.summarize([r.errors() for r in records]))

    # 11% at step 5 with a 10% drift floor: within 2 points of it, below the bar's 15%
    target = judged([record(0.10, 0.11, 0.15), record(0.10, 0.11, 0.15)])
    assert target["floor_pct"] == pytest.approx(10.0)
    assert target["limit_pct"] == pytest.approx(12.0)
    assert target["step5_pct"] == pytest.approx(11.0) and target["met"]
    # the same error on a steady run: the 5% target applies
    steady = judged([record(0.0, 0.11, 0.15)])
    assert steady["limit_pct"] == 5.0 and not steady["met"]
    # within the floor but level with the bar: not met
    level = judged([record(0.10, 0.11, 0.11)])
    assert not level["met"] and level["below_bar"] == {"3": False, "5": False, "10": False}


def test_accuracy_rounds_run_each_job_in_fresh_processes_and_report_per_job(
    tmp_path: Path,
) -> None:
    out = tmp_path / "acc"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    result = run(
        "accuracy.py", "--jobs", "mlp-small", "--steps", "300", "--max-steps", "60",
        "--rounds", "2", "--out", str(out), env={**os.environ, "TMPDIR": str(scratch)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert not list(scratch.glob("ets-accuracy-*"))  # each run's checkpoint folder is removed
    runs = json.loads(out.with_suffix(".rounds.json").read_text())["mlp-small"]
    assert len(runs) == 2
    assert all(job["steps"] == 60 for job in runs)  # --max-steps caps, and is passed on
    # each run's own report: the worst job per report step and the per-job tables
    report = (tmp_path / "acc_r1_mlp-small.md").read_text()
    assert "**Worst job**" in report and "**Per job, step 3**" in report
    assert "| last_step |" in report
    # two processes: two independent runs, each scored at the report steps
    assert runs[0]["step_ends_s"] != runs[1]["step_ends_s"]
    for job in runs:
        assert set(job["errors"]["ets-hook"]) == {"1", "2", "3", "5", "10", "20", "50"}
        # the interval of the total is kept, to score its calibration
        assert job["predictions"][4]["total_ci_s"] > 0
    table = out.with_suffix(".rounds.md").read_text()
    assert "| mlp-small | 2 |" in table and "target met at step 5" in table
    # every baseline, "last step x remaining" included, in the per-job table and the JSON
    assert "last_step at step 5" in table and "composer at step 5" in table
    assert set(runs[0]["errors"]) == {
        "ets-hook", "first_step", "mean_k", "tqdm_ema", "composer", "last_step",
    }  # fmt: skip


NEW_JOBS = (
    "mlp-loader-w0-epochs", "mlp-loader-w2-epochs", "mlp-loader-w2-persistent",
    "resnet-small-60steps", "mobilenet-small-100steps+eval", "gpt-small-120steps+accum2+ckpt",
    "transformer-small-varlen", "mlp-loader-w2-balanced",
)  # fmt: skip


def test_the_zoo_keeps_its_order_and_the_new_jobs_are_in_the_default_set() -> None:
    bench = accuracy()
    names = [job.name for job in bench.JOBS]
    assert names[:3] == ["mlp-small", "mlp-large+eval", "resnet-small"]
    assert names[bench.ZOO_JOBS - 1] == "mlp-dataloading"
    assert set(NEW_JOBS) <= set(names[bench.ZOO_JOBS :])
    specs = {job.name: job for job in bench.JOBS}
    lengths = {bench.job_steps(specs[name], 300) for name in NEW_JOBS}
    assert {60, 100, 120, 300} <= lengths  # short jobs keep their own length over --steps
    assert bench.job_steps(specs["resnet-small-60steps"], 300, cap=8) == 8
    assert bench.job_steps(specs["mlp-small"], 200) == 200
    w2 = specs["mlp-loader-w2-epochs"].loader
    assert w2.num_workers == 2 and not w2.persistent_workers
    assert specs["mlp-loader-w0-epochs"].loader.num_workers == 0
    assert specs["mlp-loader-w2-balanced"].loader.work * 10 == w2.work


def test_last_step_baseline_is_elapsed_plus_last_iteration_times_remaining() -> None:
    bench = accuracy()
    spec = bench.JobSpec("constructed", "mlp-w128-d2-b32")
    run = bench.Run(spec, steps=10, step_ends_s=[1.0, 1.5, 2.5, 3.0])
    run.phase_s_before_step = [0.0] * 4
    for k, last in ((1, 1.0), (2, 0.5), (3, 1.0), (4, 0.5)):
        rate, total = bench.baseline_rates(run, k, 0.0)["last_step"]
        assert rate == pytest.approx(last)
        assert total == pytest.approx(run.step_ends_s[k - 1] + last * (10 - k))
    assert "last_step" in bench.METHODS and "last_step" in bench.BASELINES


def test_variable_length_batches_are_seeded_and_within_bounds() -> None:
    bench = accuracy()
    specs = {job.name: job for job in bench.JOBS}
    spec = specs["transformer-small-varlen"]
    job = bench.workloads()[spec.workload].with_batch_size(2).build("cpu")

    def lengths(seed: int) -> list[int]:
        batches = bench.job_batches(job, spec, seed)
        out = []
        for _ in range(40):
            x, y = next(batches)
            assert y.shape == (2,)  # a classifier's target keeps its shape
            out.append(x.shape[1])
        return out

    drawn = lengths(0)
    assert all(16 <= n <= 128 for n in drawn) and len(set(drawn)) > 10
    assert drawn == lengths(0) and drawn != lengths(1)
    # next-token targets are cut with their inputs
    gpt = bench.workloads()["gpt-d64-l2-b8-t64"].with_batch_size(2).build("cpu")
    x, y = next(bench.varied_lengths(gpt.batches(), (8, 64)))
    assert x.shape == y.shape and 8 <= x.shape[1] <= 64
    assert bench.at_length(torch.arange(6).view(2, 3), 5).tolist() == [
        [0, 1, 2, 0, 1], [3, 4, 5, 3, 4],
    ]  # fmt: skip


class _WorkerPids(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(float(os.getpid())), torch.tensor(index)


@pytest.mark.parametrize("persistent", [False, True])
def test_epoch_batches_restart_non_persistent_workers_at_each_epoch(persistent: bool) -> None:
    bench = accuracy()
    loader = torch.utils.data.DataLoader(
        _WorkerPids(), batch_size=2, num_workers=2, persistent_workers=persistent
    )
    batches = bench.EpochBatches(loader, torch.device("cpu"))
    pids = [{int(next(batches)[0][0]) for _ in range(2)} for _ in range(3)]  # 3 epochs
    assert batches.epochs == 3 and batches.batches == 6
    batches.close()
    assert os.getpid() not in set().union(*pids)
    if persistent:
        assert pids[0] == pids[1] == pids[2]
    else:
        assert not pids[0] & pids[1] and not pids[1] & pids[2]


@pytest.mark.parametrize("name", ["mlp-loader-w0-epochs", "mlp-loader-w2-epochs"])
def test_loader_jobs_iterate_epochs_and_are_scored_by_every_method(name: str) -> None:
    bench = accuracy()
    spec = {job.name: job for job in bench.JOBS}[name]
    # tiny: 3 steps an epoch of cheap samples, 8 steps
    spec = dataclasses.replace(spec, loader=dataclasses.replace(spec.loader, samples=3 * 64,
                                                                work=256))  # fmt: skip
    run = bench.run_job(spec, 8, "cpu", op_capture="native")
    assert run.epoch_start_steps == [1, 4, 7]
    assert len(run.step_ends_s) == 8 and len(run.train_step_s) == 8
    errors = bench.errors_for(run)
    assert set(errors) == set(bench.METHODS)
    for method in bench.BASELINES:
        assert set(errors[method]) == {1, 2, 3, 5}
    assert bench.job_noise_floor(run) is None  # too short for one
    report = bench.per_job_markdown([run], [errors], 3)
    assert f"| {name} | 8 | - |" in report and "last_step" in report
    worst = bench.worst_jobs([run], [errors])
    if worst:
        assert worst[3]["worst_job"] == name


def test_a_phase_due_at_the_last_step_is_run_predicted_and_in_the_true_total() -> None:
    """A loop evaluating every 3 steps runs its evaluation after step 6 too: the benchmark's
    loop does, its truth includes it, and the hook predicted it at the last step."""
    bench = accuracy()
    spec = {job.name: job for job in bench.JOBS}["mlp-large+eval"]
    spec = dataclasses.replace(spec, workload="mlp-w128-d2-b32", eval_every=3, eval_batches=2)
    run = bench.run_job(spec, 6, "cpu", op_capture="native")
    assert run.job_end_s is not None and run.job_end_s > run.step_ends_s[-1]
    assert run.true_total_s == run.job_end_s
    last = run.predictions[-1]
    assert last is not None and last["step"] == 6 and last["remaining_steps"] == 0
    assert last["remaining_phase_s"] > 0  # the evaluation after the last step, still to come
    assert last["total_s"] > run.step_ends_s[-1]


def test_run_to_run_floor_compares_each_run_with_the_jobs_other_runs() -> None:
    bench = accuracy()

    def job(first_s: float, early_s: list[float], steady_s: float) -> dict[str, Any]:
        later = [steady_s] * 20
        return {"train_step_s": [first_s, *early_s, *later], "true_step_s": steady_s}

    # steps 2..3 at 1.1 / 1.2 / 1.0 / 1.3x the run's own steady step (steady 1 s or 2 s)
    jobs = [job(5.0, [1.1, 1.1], 1.0), job(9.0, [2.4, 2.4], 2.0),
            job(0.1, [1.0, 1.0], 1.0), job(5.0, [2.6, 2.6], 2.0)]  # fmt: skip
    # each against the median of the other three: 1.1/1.2, 1.2/1.1, 1.0/1.2, 1.3/1.1
    misses = sorted([1 - 1.1 / 1.2, 1.2 / 1.1 - 1, 1 - 1.0 / 1.2, 1.3 / 1.1 - 1])
    expected = 100 * (misses[1] + misses[2]) / 2
    assert bench.run_to_run_floor_pct(jobs, 3) == pytest.approx(expected)
    # the first step is not read; runs whose early steps stand alike have no floor
    alike = [job(first, [1.2, 1.2], 1.0) for first in (1.0, 3.0, 9.0)]
    assert bench.run_to_run_floor_pct(alike, 3) == pytest.approx(0.0)
    # the early level is the steps' median: a one-off slow step among them is not read
    spiked = [job(1.0, [1.2, 1.2, 9.0, 1.2], 1.0) if i == 1 else job(1.0, [1.2] * 4, 1.0)
              for i in range(3)]  # fmt: skip
    assert bench.run_to_run_floor_pct(spiked, 5) == pytest.approx(0.0)
    # too few runs, or runs too short for the step: no floor
    assert bench.run_to_run_floor_pct(jobs[:2], 3) is None
    assert bench.run_to_run_floor_pct(jobs, 50) is None
    assert bench.run_to_run_floor_pct(jobs, 1) is None  # no step after the first to read
    errors = {"ets-hook": {"3": [4.0, 1.0], "5": [3.0, 1.0], "10": [2.0, 1.0]}}
    runs = [{**j, "errors": errors, "noise_floor_pct": 1.0} for j in jobs]
    table = bench.rounds_table({"constructed": runs})
    assert "run-to-run floor at steps 3 / 5 / 10" in table
    assert f"| {expected:.1f} / " in table
    assert f"step 3: {expected:.1f}% (ets-hook 4.0%)" in table


def test_rounds_from_reports_runs_already_made_without_running_a_job(tmp_path: Path) -> None:
    steps = [2.0, *([1.0] * 20)]
    errors = {"ets-hook": {"3": [4.0, 1.0], "5": [3.0, 1.0], "10": [2.0, 1.0]}}
    paths = []
    for i, early in enumerate((1.1, 1.2, 1.0)):
        job = {"name": "constructed", "train_step_s": [2.0, early, early, *steps[3:]],
               "true_step_s": 1.0, "errors": errors, "noise_floor_pct": 1.0}  # fmt: skip
        paths.append(tmp_path / f"ab_r1_{i}.json")
        paths[-1].write_text(json.dumps({"jobs": [job]}))
    out = tmp_path / "report"
    # in this process (the script's own main): the report needs no job, nor a second torch import
    assert accuracy().main(["--rounds-from", *map(str, paths), "--out", str(out)]) == 0
    table = out.with_suffix(".rounds.md").read_text()
    assert "| constructed | 3 |" in table
    # 1.1 / 1.1, 1.2 / 1.05, 1.0 / 1.15: misses 0, 14.3 and 13.0%, their median 1 - 1.0 / 1.15
    assert f"| {100 * (1 - 1.0 / 1.15):.1f} / " in table
    assert len(json.loads(out.with_suffix(".rounds.json").read_text())["constructed"]) == 3
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"jobs": []}))
    assert accuracy().main(["--rounds-from", str(empty), "--out", str(out)]) == 2


def test_interval_calibration_counts_an_interval_touching_the_total_as_covering() -> None:
    bench = accuracy()
    spec = bench.JobSpec("constructed", "mlp-w128-d2-b32")

    def constructed(total_s: float, steps: int, predictions: dict[int, Any]) -> Any:
        run = bench.Run(spec, steps=steps, step_ends_s=[total_s * i / steps for i in
                                                        range(1, steps + 1)])  # fmt: skip
        run.predictions = [predictions.get(k) for k in range(1, steps + 1)]
        return run

    def interval(total_s: float, ci_s: float | None) -> dict[str, float | None]:
        return {"total_s": total_s, "total_ci_s": ci_s}

    runs = [
        # true total 100 s: at step 3 the interval 90 +- 10 ends exactly on it (inclusive: covers)
        constructed(100.0, 20, {3: interval(90.0, 10.0), 5: interval(120.0, 10.0),
                                10: interval(100.0, 4.0), 20: interval(100.0, 1.0)}),
        # true total 200 s: no interval at step 2 (None), no prediction at all at step 10
        constructed(200.0, 20, {2: interval(200.0, None), 3: interval(150.0, 30.0),
                                5: interval(210.0, 30.0)}),
        # a 4-step job: scored at step 3, not at step 5 (past its end)
        constructed(50.0, 4, {3: interval(50.0, 1.0)}),
    ]  # fmt: skip
    assert runs[0].step_ends_s[-1] == 100.0  # the totals are exact, so is the touch at step 3
    calibration = bench.interval_calibration(runs)
    # step 20 is each 20-step job's last: not a report of its future, not scored
    assert set(calibration) == {3, 5, 10}
    # step 3: covers (touch), misses (|150 - 200| > 30), covers; half-widths 10, 15, 2% of
    # the true totals (of the predicted totals they would be 11.1, 20, 2%)
    assert calibration[3]["jobs"] == 3
    assert calibration[3]["coverage_pct"] == pytest.approx(200 / 3)
    assert calibration[3]["half_width_median_pct"] == pytest.approx(10.0)
    # step 5: misses (|120 - 100| > 10), covers (|210 - 200| <= 30); half-widths 10 and 15%
    assert calibration[5] == pytest.approx(
        {"coverage_pct": 50.0, "half_width_median_pct": 12.5, "jobs": 2}
    )
    assert calibration[10] == pytest.approx(
        {"coverage_pct": 100.0, "half_width_median_pct": 4.0, "jobs": 1}
    )
    # an interval a hair narrower than the miss no longer covers it
    runs[0].predictions[2] = interval(90.0, 10.0 - 1e-9)
    assert bench.interval_calibration(runs)[3]["coverage_pct"] == pytest.approx(100 / 3)
    assert bench.interval_calibration([]) == {}


ETS_SAMPLE = SHARED_DATA / "ets-traces"
# a handful of the sample's smallest files: three families per GPU, two files a model at most
ETS_SMOKE_FAMILY = {"alexnet": "alexnet", "resnet18": "resnet", "mobilenet_v2": "mobilenet",
                    "mobilenet_v3_small": "mobilenet"}  # fmt: skip


def _ets_smoke_sample(root: Path) -> dict[str, dict[str, list[str]]]:
    """Links (not copies) to a few of the shared sample's files under ``root``, laid out as the
    sample is; per GPU, family → the file names linked."""
    rows = list(csv.DictReader((ETS_SAMPLE / "MANIFEST.csv").open()))
    picked: dict[str, dict[str, list[str]]] = {}
    per_model: dict[tuple[str, str], int] = {}
    for row in sorted(rows, key=lambda r: (int(r["rows"]), r["file"])):
        gpu, model = row["gpu"], row["model"]
        if model not in ETS_SMOKE_FAMILY or per_model.get((gpu, model), 0) == 2:
            continue
        if not (ETS_SAMPLE / gpu / row["file"]).is_file():
            continue
        per_model[(gpu, model)] = per_model.get((gpu, model), 0) + 1
        picked.setdefault(gpu, {}).setdefault(ETS_SMOKE_FAMILY[model], []).append(row["file"])
    picked = {gpu: fams for gpu, fams in picked.items() if len(fams) == 3}
    for name in ("MANIFEST.csv", "opCodes.dict"):
        (root / name).symlink_to(ETS_SAMPLE / name)
    for gpu, fams in picked.items():
        (root / gpu).mkdir()
        for name in (n for names in fams.values() for n in names):
            (root / gpu / name).symlink_to(ETS_SAMPLE / gpu / name)
    return picked


@pytest.fixture(scope="module")
def ets_paper_smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One tiny run of the ETS paper reproduction (leave one family out and the learning curve,
    ETS-LSTM and the per-op trees, 1 epoch / 5 rounds, no latency table) on links to a few
    shared sample files."""
    if not (ETS_SAMPLE / "MANIFEST.csv").is_file():
        pytest.skip(f"shared ETS sample absent: {ETS_SAMPLE}")
    root = tmp_path_factory.mktemp("ets-paper")
    data = root / "data"
    data.mkdir()
    sample = _ets_smoke_sample(data)
    if not sample:
        pytest.skip("the shared ETS sample has no GPU with alexnet, resnet18 and mobilenet files")
    out_json, out_md = root / "paper.json", root / "paper.md"
    result = run(
        "ets_paper.py", "--data", str(data), "--no-extra", "--quick", "--kinds", "lstm,tree",
        "--epochs", "1", "--tree-rounds", "5", "--curve-sizes", "2,1", "--ensemble", "1",
        "--no-latency", "--json", str(out_json), "--markdown", str(out_md),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return {"sample": sample, "results": json.loads(out_json.read_text()),
            "markdown": out_md.read_text()}  # fmt: skip


def _finite_mre(value: Any) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value >= 0


def test_ets_paper_leaves_each_family_out_once_per_gpu(ets_paper_smoke: dict[str, Any]) -> None:
    sample, results = ets_paper_smoke["sample"], ets_paper_smoke["results"]
    assert results["kinds"] == ["lstm", "tree"]
    assert set(results["families"]) == set(results["lofo"]) == set(sample)
    for gpu, fams in sample.items():
        # the families read from the model names, each model's file count
        assert {fam: sum(models.values()) for fam, models in results["families"][gpu].items()} == {
            fam: len(files) for fam, files in fams.items()
        }
    rows = results["lofo_per_fold"]
    assert sorted((row["gpu"], row["fold"]) for row in rows) == sorted(
        (gpu, fam) for gpu, fams in sample.items() for fam in fams
    )  # one row per held-out family per GPU
    for row in rows:
        assert row["files"] == len(sample[row["gpu"]][row["fold"]])
        # the per-op baseline is scored beside the BiLSTM on the same held-out files
        assert _finite_mre(row["lstm"]) and _finite_mre(row["tree"])
    for gpu, fams in sample.items():
        files = sorted(name for names in fams.values() for name in names)
        for kind in ("lstm", "tree"):
            per = results["lofo"][gpu][kind]
            # every held-out file predicted once, by the fold that left its family out
            labels = [r["label"].split("/", 1) for r in per["records"]]  # "T4/a.1_7.csv#7"
            assert sorted(name.rsplit("#", 1)[0] for _, name in labels) == files
            assert {held_gpu for held_gpu, _ in labels} == {gpu}
            assert all(r["family"] == r["fold"] for r in per["records"])
            assert per["summary"]["files"] == len(files)
            assert per["summary"]["folds"] == len(fams)
            assert _finite_mre(per["summary"]["mre"])
    table = ets_paper_smoke["markdown"]
    assert "## Leave one family out" in table
    for gpu in sample:
        assert f"| {gpu} | " in table
    assert "| ETS-LSTM |" in table and "| per-op boosted trees |" in table
    assert "## Leave one model out" not in table  # --quick leaves it out


def test_ets_paper_learning_curve_grows_its_training_sets(ets_paper_smoke: dict[str, Any]) -> None:
    sample, results = ets_paper_smoke["sample"], ets_paper_smoke["results"]
    assert set(results["learning_curve"]) == set(sample)
    for gpu, points in results["learning_curve"].items():
        *subsets, full = points
        sizes = [point["train_files"] for point in subsets]
        assert sizes == [1, 2]  # --curve-sizes, in increasing order
        smallest_pool = min(
            sum(len(files) for other, files in sample[gpu].items() if other != held)
            for held in sample[gpu]
        )
        assert sizes[-1] < smallest_pool  # so every family is held out at every size
        for point in subsets:
            assert point["folds"] == len(sample[gpu])
            assert _finite_mre(point["lstm"]) and _finite_mre(point["tree"])
        # the last point: all of each fold's training files, the leave-one-family-out run itself
        assert full["train_files"].startswith("all (")
        for kind in ("lstm", "tree"):
            assert full[kind] == pytest.approx(results["lofo"][gpu][kind]["summary"]["mre"])
    assert "## Learning curve" in ets_paper_smoke["markdown"]


def test_ets_paper_rejects_a_curve_size_below_one() -> None:
    result = run("ets_paper.py", "--curve-sizes", "2,0")
    assert result.returncode == 2
    assert "--curve-sizes" in result.stderr and "'2,0'" in result.stderr


def test_generation_cost_measures_one_model() -> None:
    result = run("generation_cost.py", "--rounds", "1", "--models", "t5-d64-l2", "--shapes", "4x16")
    assert result.returncode == 0, result.stderr
    assert "t5-d64-l2 batch 4x16" in result.stdout
    assert result.stdout.count("of the forward") == 3  # three generations
