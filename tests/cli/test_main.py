"""The ``ets-hook`` command line, run through the installed entry point as a user runs it.

Exit codes (cli/common.py): 0 success, 1 runtime failure, 2 bad usage or unreadable input. The
subcommands on traces from real hook runs, every bad-input case and the exit-code documentation
are in test_entry_point.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import pytest
from support import ETS_MODELS, sample_trace, write_ets_tree

import ets_hook
from ets_hook.cli.demo import REPORT_STEPS
from ets_hook.ets.regressors import Predictor
from ets_hook.trace.events import HostInfo
from ets_hook.trace.io import load_trace
from ets_hook.trace.summary import format_info, summarize_iteration

ETS_HOOK = Path(sys.executable).with_name("ets-hook")


def ets_hook_cli(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    assert ETS_HOOK.is_file(), f"the console script is not installed next to python: {ETS_HOOK}"
    return subprocess.run(
        [str(ETS_HOOK), *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


def assert_clean_error(run: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    """Failed with ``code``, said why on stderr (naming ``needles``), and no traceback."""
    assert run.returncode == code, (run.returncode, run.stdout, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    for needle in needles:
        assert needle in run.stderr, (needle, run.stderr)


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trace") / "sample.ets"
    ets_hook.save_trace(sample_trace(), path)
    return path


# ---------------------------------------------------------------------------------------------
# --version, --help


def test_version_is_the_packages() -> None:
    run = ets_hook_cli("--version")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"ets-hook {ets_hook.__version__}"
    assert metadata.version("ets-hook") == ets_hook.__version__


def test_info_does_not_import_torch(trace_file: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-X", "importtime", str(ETS_HOOK), "info", str(trace_file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in run.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    assert "ets_hook.trace.io" in imported  # the check sees the package's own imports
    assert "torch" not in imported


# ---------------------------------------------------------------------------------------------
# info, export


def test_info_prints_the_trace_table(trace_file: Path) -> None:
    run = ets_hook_cli("info", trace_file)
    assert run.returncode == 0, run.stderr
    trace = load_trace(trace_file)
    assert run.stdout.rstrip("\n") == format_info(trace, str(trace_file))
    lines = run.stdout.splitlines()
    assert lines[0].split() == ["trace", str(trace_file)]
    assert trace.device.name in lines[1]
    assert f"rank     {trace.rank}/{trace.world_size}" in lines
    skip, steps = trace.capture.skip_steps, trace.capture.capture_steps
    assert lines[2].startswith(f"capture  steps {skip + 1}-{skip + steps}   ops: ")
    rows = [line.split() for line in lines if re.match(r"^\s+\d+\s", line)]
    assert len(rows) == len(trace.iterations)
    for row, iteration in zip(rows, trace.iterations, strict=True):
        s = summarize_iteration(iteration)
        assert [int(v) for v in (row[0], row[2], row[3], row[4])] == [
            s.step + 1,  # counted from 1, as the log counts steps
            s.ops,
            s.top_level_ops,
            s.kernels,
        ]
    step_times = ", ".join(f"{t * 1e3:.2f}" for t in trace.step_times_s)
    assert lines[-1] == f"step times (ms) from step 1: {step_times}"


def test_info_json(trace_file: Path) -> None:
    run = ets_hook_cli("info", "--json", trace_file)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)  # nothing but the document on stdout
    trace = load_trace(trace_file)
    assert doc["trace"] == str(trace_file)
    assert doc["device"]["name"] == trace.device.name
    assert doc["device"]["uuid"] == trace.device.uuid
    assert doc["capture"]["skip_steps"] == trace.capture.skip_steps
    assert doc["capture"]["dropped_records"] == trace.capture.dropped_records
    assert doc["torch_version"] == trace.torch_version
    assert doc["step_times_s"] == trace.step_times_s
    assert [it["step"] for it in doc["iterations"]] == [it.step for it in trace.iterations]
    for row, iteration in zip(doc["iterations"], trace.iterations, strict=True):
        s = summarize_iteration(iteration)
        assert (row["ops"], row["top_level_ops"], row["kernels"], row["correlated_kernels"]) == (
            s.ops,
            s.top_level_ops,
            s.kernels,
            s.correlated_kernels,
        )


def test_info_json_has_what_the_header_shows(tmp_path: Path) -> None:
    trace = sample_trace()
    trace.host = HostInfo(hostname="node-7", cpu_model="Xeon", physical_cores=8, logical_cores=16)
    path = ets_hook.save_trace(trace, tmp_path / "t.ets")
    header = ets_hook_cli("info", path).stdout
    assert "host node-7" in header and "ets-hook 0.1.0" in header and "rank     1/2" in header
    run = ets_hook_cli("info", "--json", path)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    # Under the trace's own names; host as device is: all of its fields.
    assert doc["ets_hook_version"] == trace.ets_hook_version == "0.1.0"
    assert doc["host"] == asdict(trace.host)
    assert doc["host"]["hostname"] == "node-7"
    assert (doc["rank"], doc["world_size"]) == (trace.rank, trace.world_size) == (1, 2)
    several = json.loads(ets_hook_cli("info", "--json", path, path).stdout)
    assert [t["host"]["hostname"] for t in several["traces"]] == ["node-7", "node-7"]
    assert [t["rank"] for t in several["traces"]] == [1, 1]


def test_export_chrome(trace_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    run = ets_hook_cli("export", trace_file, "--chrome", out)
    assert run.returncode == 0, run.stderr
    trace = load_trace(trace_file)
    ops = [op for it in trace.iterations for op in it.ops]
    kernels = [k for it in trace.iterations for k in it.kernels]
    events = json.loads(out.read_text())["traceEvents"]
    # The count is what the file holds: ops, kernels, steps, launch arrows and track names.
    assert len(events) > len(ops) + len(kernels)
    assert run.stdout.startswith(
        f"wrote {out} ({len(events)} trace events: {len(ops)} ops, {len(kernels)} kernels)"
    )
    complete = [e for e in events if e["ph"] == "X"]
    assert sorted(e["name"] for e in complete if e["cat"] == "op") == sorted(o.name for o in ops)
    assert sorted(e["name"] for e in complete if e["cat"] in ("kernel", "memcpy")) == sorted(
        k.name for k in kernels
    )
    steps = [e["name"] for e in complete if e["cat"] == "step"]
    # Counted from 1, as ``info`` and the log count steps: the trace's step 1 is "step 2".
    assert steps == [f"step {it.step + 1}" for it in trace.iterations] == ["step 2", "step 3"]
    assert {e["args"]["step"] for e in complete if e["cat"] == "op"} == {2}


# ---------------------------------------------------------------------------------------------
# error paths


@pytest.mark.parametrize(
    ("args", "usage", "message"),
    [
        (["frobnicate"], "usage: ets-hook ", "invalid choice: 'frobnicate'"),
        ([], "usage: ets-hook ", "required: COMMAND"),
        (["info"], "usage: ets-hook info", "required: trace"),
        (["export", "x.ets"], "usage: ets-hook export", "--chrome"),
        (["demo", "--model", "resnet9000"], "usage: ets-hook demo", "invalid choice"),
        (["demo", "--steps", "many"], "usage: ets-hook demo", "invalid int value: 'many'"),
        (["train", "x.csv", "-o", "m.npz", "--epochs", "1.5"], "usage: ets-hook train", "1.5"),
        (["train", "x.csv"], "usage: ets-hook train", "-o/--output"),
        (["evaluate", "--json", "m.npz"], "usage: ets-hook evaluate", "TRACES"),
    ],
    ids=[
        "unknown-subcommand",
        "no-subcommand",
        "info-no-trace",
        "export-no-chrome",
        "demo-bad-model",
        "demo-bad-steps",
        "train-bad-epochs",
        "train-no-output",
        "evaluate-no-traces",
    ],
)
def test_usage_errors_exit_2(args: list[str], usage: str, message: str) -> None:
    run = ets_hook_cli(*args)
    assert_clean_error(run, 2, usage, message)
    assert run.stdout == ""


def test_demo_too_few_steps_fails_before_training() -> None:
    run = ets_hook_cli("demo", "--model", "gpt", "--steps", "3")
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    assert re.search(r"--steps.*\b10\b", run.stderr), run.stderr
    assert run.stdout == ""  # nothing was trained


def test_demo_cuda_without_a_gpu_fails_cleanly() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is available here")
    run = ets_hook_cli("demo", "--model", "gpt", "--steps", "10", "--device", "cuda")
    assert_clean_error(run, 2, "ets-hook demo: error: --device cuda: no CUDA device")
    assert run.stdout == ""


# ---------------------------------------------------------------------------------------------
# demo: one real run (the quickest the flags allow), asserted many ways

DEMO_STEPS = 10  # the smallest --steps demo accepts


@dataclass(frozen=True)
class DemoRun:
    run: subprocess.CompletedProcess[str]
    trace_path: Path


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    trace_path = tmp_path_factory.mktemp("demo") / "demo.ets"
    # gpt is the quickest built-in model on CPU (~10 ms/step on 2 cores)
    run = ets_hook_cli(
        "demo", "--model", "gpt", "--steps", DEMO_STEPS, "--seed", "0", "--trace", trace_path
    )
    return DemoRun(run, trace_path)


@pytest.mark.slow
def test_demo_exits_0_on_cpu(demo: DemoRun) -> None:
    assert demo.run.returncode == 0, demo.run.stdout + demo.run.stderr
    assert "Traceback" not in demo.run.stderr
    first = demo.run.stdout.splitlines()[0]
    assert first.startswith("ets-hook demo: ")
    assert f"on cpu, {DEMO_STEPS} steps" in first


@pytest.mark.slow
def test_demo_capture_summary_matches_the_trace_it_wrote(demo: DemoRun) -> None:
    out = demo.run.stdout
    assert re.search(r"^capture: .+; kernels: .+$", out, re.MULTILINE)
    summary = re.findall(r"^  step (\d+): +([\d.]+) ms, (\d+) ops \((\d+) top-level\)", out, re.M)
    trace = load_trace(demo.trace_path)
    assert trace.iterations, "the demo captured no step"
    assert len(summary) == len(trace.iterations)
    for (step, _ms, ops, top), iteration in zip(summary, trace.iterations, strict=True):
        s = summarize_iteration(iteration)
        assert (int(step), int(ops), int(top)) == (s.step + 1, s.ops, s.top_level_ops)
        assert s.ops > 0


@pytest.mark.slow
def test_demo_predictions_versus_actual(demo: DemoRun) -> None:
    out = demo.run.stdout
    early = re.findall(r"^  after step +(\d+): +([\d.]+) ms/step", out, re.MULTILINE)
    expected_steps = [s for s in REPORT_STEPS if s <= DEMO_STEPS]
    assert [int(step) for step, _ in early] == expected_steps

    actual = re.search(
        r"^actual: total \S+ \(([\d.]+) s\), steady state ([\d.]+) ms/step", out, re.MULTILINE
    )
    assert actual, out
    actual_total_s, steady_ms = float(actual.group(1)), float(actual.group(2))
    assert actual_total_s > 0 and steady_ms > 0

    table = re.findall(
        r"^ +(\d+) +([\d.]+) +([-+][\d.]+)% +([\d.]+) +([-+][\d.]+)%  (\S+)$",
        out,
        re.MULTILINE,
    )
    assert [int(row[0]) for row in table] == expected_steps
    for (step, ms, ms_err, total_s, total_err, _source), (_, early_ms) in zip(
        table, early, strict=True
    ):
        assert float(ms) == pytest.approx(float(early_ms), abs=0.011), step
        # each error is (predicted - actual) / actual, up to the printed rounding
        assert float(ms_err) == pytest.approx(
            100 * (float(ms) - steady_ms) / steady_ms, abs=rounding(float(ms), steady_ms)
        )
        assert float(total_err) == pytest.approx(
            100 * (float(total_s) - actual_total_s) / actual_total_s,
            abs=rounding(float(total_s), actual_total_s),
        )


def rounding(predicted: float, actual: float) -> float:
    """How far a percentage error printed with one decimal can be from one recomputed from
    ``predicted`` and ``actual`` as printed with two decimals."""
    half = 0.005
    return 100 * half * (1 / actual + (predicted + half) / (actual - half) ** 2) + 0.05 + 1e-9


# ---------------------------------------------------------------------------------------------
# train, then evaluate, on tiny synthetic ETS CSV traces


@dataclass(frozen=True)
class Trained:
    data: Path
    model: Path
    run: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    root = tmp_path_factory.mktemp("ets")
    data = write_ets_tree(root / "traces")
    model = root / "out" / "model.npz"
    run = ets_hook_cli(
        "train", data / "T4", "-o", model, "--model", "mlp", "--epochs", "2",
        "--hidden", "8", "--lr", "1e-3", "--seed", "1", "--no-progress",
    )  # fmt: skip
    return Trained(data, model, run)


@pytest.mark.slow
def test_train_writes_a_loadable_model(trained: Trained) -> None:
    assert trained.run.returncode == 0, trained.run.stderr
    assert "Traceback" not in trained.run.stderr
    predictor = Predictor.load(trained.model)
    assert predictor.kind == "mlp" and predictor.hidden == 8
    assert len(predictor.training["trace_files"]) == 3 * len(ETS_MODELS)
    said = re.search(r"^trained mlp on (\d+) iterations", trained.run.stdout, re.MULTILINE)
    assert said and int(said.group(1)) == predictor.training["train_iterations"]
    assert trained.run.stdout.rstrip().endswith(f"wrote {trained.model}")


@pytest.mark.slow
def test_evaluate_table(trained: Trained) -> None:
    run = ets_hook_cli("evaluate", trained.model, trained.data)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"model: {trained.model} (mlp, ")
    assert re.search(rf"^iterations: {3 * len(ETS_MODELS)}\s+MRE: [\d.]+%", run.stdout, re.M)
    for name, _layers in ETS_MODELS:
        assert re.search(rf"^{name}\s+3\s", run.stdout, re.MULTILINE), name


@pytest.mark.slow
def test_evaluate_json(trained: Trained) -> None:
    one = trained.data / "T4" / f"{ETS_MODELS[0][0]}.2_7.csv"
    run = ets_hook_cli("evaluate", trained.model, trained.data, one, "--json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["model_file"] == str(trained.model) and doc["model"] == "mlp"
    assert doc["iterations"] == 3 * len(ETS_MODELS) + 1  # the folder, then the file again
    assert set(doc["by_model"]) == {name for name, _ in ETS_MODELS}
    rows = doc["per_iteration"]
    errors = [abs(r["measured_ms"] - r["predicted_ms"]) / r["measured_ms"] for r in rows]
    assert doc["mre"] == pytest.approx(sum(errors) / len(errors))


@pytest.mark.slow
def test_evaluate_with_a_truncated_model_file_exits_2(trained: Trained, tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(trained.model.read_bytes()[:2000])  # an interrupted copy
    run = ets_hook_cli("evaluate", truncated, trained.data)
    assert_clean_error(run, 2, str(truncated))
