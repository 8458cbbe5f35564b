"""Every ``ets-hook`` subcommand through the installed console script, on real inputs.

The traces are written by real ``ETSHook`` runs (three small models, once per module); ``train``
fits on them and ``evaluate`` reads the model back. Exit codes, as ``ets-hook --help`` says: 0
success; 2 usage errors, invalid option values and unreadable or invalid inputs (one line on
stderr naming the file, no traceback); 1 a failure while running; 130 interrupted. The demo's
full run is in ``test_main.py`` (one shared run).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from support import ETS_HOOK

from ets_hook.cli.common import EXIT_CODES_HELP
from ets_hook.ets.regressors import Predictor
from ets_hook.trace.importers import ETS_CSV_COLUMNS
from ets_hook.trace.io import load_trace, save_trace
from ets_hook.trace.summary import summarize_iteration

#: Every subcommand ``ets-hook --help`` lists; each one is run here (demo: in test_main.py).
SUBCOMMANDS = ("info", "export", "demo", "build-ops", "train", "evaluate", "watch")
#: Steps of each real run; the capture window is steps 1-3.
STEPS, CAPTURED = 6, 3


def ets_hook(
    *args: str | Path, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the installed ``ets-hook`` with ``args``; fails the test if it runs past ``timeout``."""
    assert ETS_HOOK, f"no ets-hook console script beside {sys.executable}"
    try:
        return subprocess.run(
            [ETS_HOOK, *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"ets-hook {' '.join(map(str, args))} still running after {timeout} s")


def assert_input_error(
    run: subprocess.CompletedProcess[str], command: str, *needles: str | Path
) -> None:
    """Exit 2, nothing on stdout, one line ``ets-hook CMD: error: ...`` naming ``needles``."""
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"ets-hook {command}: error: "), lines[0]
    for needle in needles:
        assert str(needle) in lines[0], (needle, lines[0])


def assert_usage_error(run: subprocess.CompletedProcess[str], command: str, *needles: str) -> None:
    """Exit 2 from argparse: the usage line, then one error line naming ``needles``."""
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    assert run.stdout == ""
    assert run.stderr.startswith(f"usage: ets-hook {command}"), run.stderr
    error = run.stderr.splitlines()[-1]
    assert error.startswith(f"ets-hook {command}: error: "), error
    for needle in needles:
        assert needle in error, (needle, error)


# ---------------------------------------------------------------------------------------------
# real inputs: traces from real ETSHook runs, a model trained on them


def _real_run(path: Path, make_model: Callable[[], object], make_input: Callable[[], object]):
    import torch
    from torch import nn

    from ets_hook import ETSHook

    torch.manual_seed(0)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)  # type: ignore[attr-defined]
    hook = ETSHook(
        model,
        optimizer=optimizer,
        total_steps=STEPS,
        skip_steps=1,
        capture_steps=CAPTURED,
        trace_path=path,
        log_every=None,
    )
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(STEPS):
        x = make_input()
        optimizer.zero_grad()
        loss_fn(model(x), torch.randint(0, 4, (x.shape[0],))).backward()  # type: ignore[operator]
        optimizer.step()
    hook.close()
    assert path.is_file(), hook.capture_status


@pytest.fixture(scope="module")
def real_traces(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three ``.ets`` files, each from a real ETSHook run (MLP, CNN, LSTM; three models)."""
    import torch
    from torch import nn

    class CNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.head = nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.relu(self.conv(x)).mean(dim=(2, 3)))

    class LSTMNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(50, 16)
            self.lstm = nn.LSTM(16, 16, batch_first=True)
            self.head = nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out, _ = self.lstm(self.emb(x))
            return self.head(out[:, -1])

    jobs = {
        "mlp": (
            lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)),
            lambda: torch.randn(8, 16),
        ),
        "cnn": (CNN, lambda: torch.randn(4, 3, 8, 8)),
        "lstm": (LSTMNet, lambda: torch.randint(0, 50, (4, 6))),
    }
    folder = tmp_path_factory.mktemp("real-traces")
    paths = []
    for name, (make_model, make_input) in jobs.items():
        _real_run(folder / f"{name}.ets", make_model, make_input)
        paths.append(folder / f"{name}.ets")
    return paths


@dataclass(frozen=True)
class Trained:
    model: Path
    run: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def trained(real_traces: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """``ets-hook train`` on the real traces (an MLP model: the quickest kind)."""
    model = tmp_path_factory.mktemp("trained") / "out" / "model.npz"
    run = ets_hook(
        "train", *real_traces, "-o", model, "--model", "mlp", "--epochs", "2",
        "--hidden", "8", "--lr", "1e-3", "--no-progress",
    )  # fmt: skip
    return Trained(model, run)


# ---------------------------------------------------------------------------------------------
# --help: every subcommand, and the exit codes


def test_the_console_script_is_installed_in_this_environment() -> None:
    assert ETS_HOOK and Path(ETS_HOOK).parent == Path(sys.executable).parent


def test_help_lists_exactly_the_subcommands_tested() -> None:
    run = ets_hook("--help")
    assert run.returncode == 0, run.stderr
    listed = re.search(r"^  COMMAND\n((?:    .*\n|      .*\n)+)", run.stdout, re.MULTILINE)
    assert listed, run.stdout
    assert tuple(re.findall(r"^    (\S+)", listed.group(1), re.MULTILINE)) == SUBCOMMANDS


def test_help_documents_the_exit_codes() -> None:
    run = ets_hook("--help")
    assert run.returncode == 0, run.stderr
    assert run.stdout.rstrip().endswith(EXIT_CODES_HELP)
    for code in ("0", "1", "2", "130"):
        assert re.search(rf"^  {code} +\S", run.stdout, re.MULTILINE), code


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_each_subcommand_documents_its_exit_codes(command: str) -> None:
    run = ets_hook(command, "--help")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"usage: ets-hook {command}")
    codes = run.stdout[run.stdout.index("\nexit codes:\n") :]
    for code in ("0", "1", "2", "130"):
        assert re.search(rf"^  {code} +\S", codes, re.MULTILINE), (code, codes)


# ---------------------------------------------------------------------------------------------
# success on real inputs


def test_info_on_real_traces(real_traces: list[Path]) -> None:
    for path in real_traces:
        run = ets_hook("info", path)
        assert run.returncode == 0, run.stderr
        assert run.stderr == ""
        trace = load_trace(path)
        assert [it.step for it in trace.iterations] == list(range(1, 1 + CAPTURED))
        rows = [line.split() for line in run.stdout.splitlines() if re.match(r"^\s+\d+\s", line)]
        assert [(int(r[0]), int(r[2])) for r in rows] == [
            (it.step + 1, summarize_iteration(it).ops) for it in trace.iterations
        ]
        assert all(int(r[2]) > 0 for r in rows)


def test_info_json_on_a_real_trace(real_traces: list[Path]) -> None:
    run = ets_hook("info", real_traces[1], "--json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    trace = load_trace(real_traces[1])
    assert doc["device"]["kind"] == trace.device.kind == "cpu"
    assert doc["capture"]["op_capture"] == trace.capture.op_capture
    assert doc["step_times_s"] == trace.step_times_s  # the steps up to the decode
    assert len(trace.step_times_s) > CAPTURED
    assert [row["ops"] for row in doc["iterations"]] == [len(it.ops) for it in trace.iterations]


def _paper_csv(path: Path) -> Path:
    """A 3-row ETS paper CSV (conv, attention without params, relu) and its opCodes.dict."""
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / "opCodes.dict").write_text("{'conv2d': 203, 'attention': 172, 'relu': 152}")
    conv = "[2, 3, 8, 8, 4, 8, 8, 3, 3" + ", 1" * 8 + ", 4" + ", 0" * 12 + "]"
    rows = [  # op, params, kStart, kEnd, kernels, kduration (ns), space
        (203, conv, 1_000, 4_000, 2, 3_000, 200),
        (172, "[0, 0]", 4_200, 9_200, 3, 5_000, 300),
        (152, "[2, 4, 8, 8" + ", 0" * 26 + "]", 9_500, 10_500, 1, 1_000, 100),
    ]
    lines = [",".join(ETS_CSV_COLUMNS)]
    for i, (op, params, k0, k1, kernels, kdur, space) in enumerate(rows):
        r = 500 * i
        lines.append(
            f'{op},1,"{params}",4,128,100,400,{r},{r + 400},{k0},{k1},0,{space},{space},'
            f"{7 + i},{kernels},400,{kdur},2,8,8,1"
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def test_info_and_export_read_a_paper_csv(tmp_path: Path) -> None:
    csv_path = _paper_csv(tmp_path / "T4" / "net.1_7.csv")
    run = ets_hook("info", csv_path)
    assert run.returncode == 0, run.stderr
    assert "import   ets-csv: model net, config 1, batch 2, input 8x8, precision fp32" in run.stdout
    assert "rows without params 1" in run.stdout
    assert "1 of 3 rows have no params recorded" in run.stderr  # the importer's one warning
    row = next(line.split() for line in run.stdout.splitlines() if re.match(r"^\s+8\s", line))
    assert row[:6] == ["8", row[1], "3", "3", "6", "6"]  # step 7 (shown from 1); 6 kernels
    doc = json.loads(ets_hook("info", "--json", csv_path).stdout)
    assert doc["metadata"]["unrecorded_params_rows"] == 1
    assert doc["metadata"]["source"] == "ets-csv"
    # An imported trace says no ets-hook version; rank 0 of 1 (the trace's defaults).
    assert (doc["ets_hook_version"], doc["rank"], doc["world_size"]) == (None, 0, 1)
    assert doc["host"]["hostname"] == ""
    (step,) = doc["iterations"]
    assert (step["kernels"], step["correlated_kernels"]) == (6, 6)
    assert step["gpu_ms"] == pytest.approx(0.009)  # the rows' kernel time: 3 + 5 + 1 us
    assert step["gaps_ms"] == pytest.approx(0.0006)
    out = tmp_path / "chrome.json"
    run = ets_hook("export", csv_path, "--chrome", out)
    assert run.returncode == 0, run.stderr
    assert len([e for e in json.loads(out.read_text())["traceEvents"] if e.get("ph") == "X"]) >= 3


def test_export_a_real_trace(real_traces: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "chrome.json"
    run = ets_hook("export", real_traces[2], "--chrome", out)
    assert run.returncode == 0, run.stderr
    trace = load_trace(real_traces[2])
    ops = [op.name for it in trace.iterations for op in it.ops]
    events = json.loads(out.read_text())["traceEvents"]
    assert run.stdout.startswith(f"wrote {out} ({len(events)} trace events: {len(ops)} ops, 0 ")
    steps = [e["name"] for e in events if e["ph"] == "X" and e["cat"] == "step"]
    assert steps == [f"step {n}" for n in range(2, 2 + CAPTURED)]  # as info and the log count
    assert sorted(e["name"] for e in events if e["ph"] == "X" and e["cat"] == "op") == sorted(ops)


def test_build_ops_finds_or_builds_the_observer() -> None:
    import torch

    run = ets_hook("build-ops", timeout=300)  # the session built it into ETS_HOOK_CACHE_DIR
    assert run.returncode == 0, run.stderr
    said = re.fullmatch(
        rf"native op observer for torch {re.escape(torch.__version__)}: (\S+) \([\d.]+ s\)\n",
        run.stdout,
    )
    assert said, run.stdout
    built = Path(said.group(1))
    assert built.is_file()
    assert Path(os.environ["ETS_HOOK_CACHE_DIR"]) in built.parents


def test_train_on_real_traces(trained: Trained, real_traces: list[Path]) -> None:
    assert trained.run.returncode == 0, trained.run.stderr
    assert "Traceback" not in trained.run.stderr
    predictor = Predictor.load(trained.model)
    assert predictor.kind == "mlp" and predictor.hidden == 8
    assert predictor.training["trace_files"] == [p.name for p in real_traces]
    said = re.search(r"^trained mlp on (\d+) iterations", trained.run.stdout, re.MULTILINE)
    assert said and int(said.group(1)) == predictor.training["train_iterations"]
    assert trained.run.stdout.rstrip().endswith(f"wrote {trained.model}")


def test_evaluate_on_real_traces(trained: Trained, real_traces: list[Path]) -> None:
    folder = real_traces[0].parent
    run = ets_hook("evaluate", trained.model, folder)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"model: {trained.model} (mlp, ")
    assert re.search(rf"^iterations: {3 * CAPTURED}\s+MRE: [\d.]+%", run.stdout, re.MULTILINE)
    for model in ("Sequential", "CNN", "LSTMNet"):
        assert re.search(rf"^{model}\s+{CAPTURED}\s", run.stdout, re.MULTILINE), model

    run = ets_hook("evaluate", trained.model, real_traces[0], "--json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["iterations"] == CAPTURED and set(doc["by_model"]) == {"Sequential"}
    steps = {it.step: it.duration_ns / 1e6 for it in load_trace(real_traces[0]).iterations}
    for row in doc["per_iteration"]:  # the ops' own time and gaps: within the step
        assert 0 < row["measured_ms"] <= steps[int(row["label"].rsplit("#", 1)[1])]
        assert row["predicted_ms"] > 0


# ---------------------------------------------------------------------------------------------
# bad inputs: exit 2, one line naming the file, no traceback


def _bad_input(kind: str, folder: Path, real_trace: Path, model: Path | None = None) -> Path:
    """Make a bad input of ``kind`` under ``folder``; returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "missing":
        return folder / "does-not-exist.ets"
    if kind == "folder":
        (folder / "empty-folder").mkdir()
        return folder / "empty-folder"
    if kind == "fifo":
        os.mkfifo(folder / "pipe.ets")
        return folder / "pipe.ets"
    path = folder / {"bad-csv": "net.1_7.csv", "no-metadata": "weights.npz"}.get(kind, "bad.ets")
    if kind == "garbage":
        path.write_bytes(b"this is not an ets-hook trace\n" * 4)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        data = (model or real_trace).read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "bad-csv":
        (folder / "opCodes.dict").write_text("{'conv2d': 203}")  # else a warning line comes first
        path.write_text(",".join(ETS_CSV_COLUMNS) + "\n1,2\n")
    elif kind == "no-metadata":
        np.savez(path, weights=np.zeros(3))
    else:
        raise AssertionError(kind)
    return path


#: (subcommand, bad input): every kind for info and for evaluate's MODEL; for the commands that
#: share a loader with one of those, the kinds that take another path through the command.
CASES = [
    *(
        ("info", kind)
        for kind in ("missing", "folder", "fifo", "garbage", "empty", "truncated", "bad-csv")
    ),
    *(("export", kind) for kind in ("missing", "fifo", "truncated")),
    *(("train", kind) for kind in ("missing", "folder", "fifo", "garbage", "bad-csv")),
    *(("evaluate", kind) for kind in ("missing", "folder", "fifo", "truncated", "bad-csv")),
    *(("evaluate-model", kind) for kind in ("missing", "folder", "fifo", "garbage")),
    *(("evaluate-model", kind) for kind in ("truncated", "no-metadata")),
]


@pytest.mark.parametrize(("command", "kind"), CASES, ids=[f"{c}-{k}" for c, k in CASES])
def test_a_bad_input_exits_2_with_one_line_naming_it(
    command: str, kind: str, real_traces: list[Path], trained: Trained, tmp_path: Path
) -> None:
    model = trained.model if command == "evaluate-model" else None
    bad = _bad_input(kind, tmp_path / "in", real_traces[0], model)
    out = tmp_path / "out"
    args: list[str | Path] = {
        "info": ["info", bad],
        "export": ["export", bad, "--chrome", out / "chrome.json"],
        "train": ["train", bad, "-o", out / "model.npz"],
        "evaluate": ["evaluate", trained.model, bad],
        "evaluate-model": ["evaluate", bad, real_traces[0]],
    }[command]
    out.mkdir()
    run = ets_hook(*args, timeout=30)  # a loader that opened the FIFO would block: fail instead
    assert_input_error(run, command.removesuffix("-model"), bad)
    # The documented shape: ets-hook CMD: error: FILE: PROBLEM (FILE:LINE: in a CSV)
    assert re.search(rf": error: {re.escape(str(bad))}:(\d+:)? ", run.stderr), run.stderr
    assert list(out.iterdir()) == []  # nothing written


#: Files that are not weights files, given as evaluate's MODEL, and what the line says they are.
NOT_WEIGHTS = {
    "trace": "it is an ets-hook trace (.ets)",
    "npy": "it is a single numpy array (.npy)",
    "json": "it is JSON text",
    "empty": "the file is empty",
    "text": "not a .npz archive",
}


@pytest.mark.parametrize("kind", list(NOT_WEIGHTS))
def test_evaluate_with_another_file_as_the_model_says_it_is_not_a_weights_file(
    kind: str, real_traces: list[Path], tmp_path: Path
) -> None:
    """Not numpy's advice about pickled data and ``allow_pickle=``: the file is named and
    said not to be a weights file (``ets-hook evaluate run.ets run.ets`` is the easy slip)."""
    model = {
        "trace": real_traces[0],
        "npy": tmp_path / "weights.npy",
        "json": tmp_path / "eta.json",
        "empty": tmp_path / "model.npz",
        "text": tmp_path / "model.npz",
    }[kind]
    if kind == "npy":
        np.save(model, np.zeros(3))
    elif kind == "json":
        model.write_text('{"format": "ets-hook-status"}')
    elif kind == "empty":
        model.write_bytes(b"")
    elif kind == "text":
        model.write_text("weights\n")
    run = ets_hook("evaluate", model, real_traces[1], timeout=60)
    assert_input_error(run, "evaluate", model, "not an ets-hook weights file", NOT_WEIGHTS[kind])
    assert "pickle" not in run.stderr


def _as_rank(trace_file: Path, out: Path, rank: int, world_size: int) -> Path:
    """A copy of ``trace_file`` that says it is ``rank`` of ``world_size`` processes."""
    trace = load_trace(trace_file)
    trace.rank, trace.world_size = rank, world_size
    save_trace(trace, out)
    return out


def test_info_on_the_ranks_of_one_job_prints_the_per_rank_table(
    real_traces: list[Path], tmp_path: Path
) -> None:
    ranks = [_as_rank(real_traces[0], tmp_path / f"run.rank{r}.ets", r, 2) for r in (0, 1)]
    run = ets_hook("info", *ranks)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    table = run.stdout.split("per rank (medians over the captured steps):\n", 1)[1]
    assert [line.split()[0] for line in table.splitlines()[1:3]] == ["0", "1"]
    doc = json.loads(ets_hook("info", "--json", *ranks).stdout)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1] and doc["not_one_job"] is None


#: Traces given together that are not the ranks of one job: (rank, world size) of each copy
#: of real_traces[0] (None: real_traces[1], another model, as rank 0 of 1), and the reason.
NOT_ONE_JOB = {
    "two-jobs": ([(0, 1), None], "{0} and {1} both say rank 0"),
    "same-rank": ([(1, 2), (1, 2)], "{0} and {1} both say rank 1"),
    "world-sizes": ([(0, 2), (1, 4)], "their world sizes differ ({0}: 2, {1}: 4)"),
    "models": ([(1, 2), None], "they trace different models ({0}: Sequential, {1}: CNN)"),
}


@pytest.mark.parametrize("case", list(NOT_ONE_JOB))
def test_info_on_traces_of_different_jobs_warns_and_compares_no_ranks(
    case: str, real_traces: list[Path], tmp_path: Path
) -> None:
    """``ets-hook info a.ets b.ets`` on unrelated traces: each trace's table, then one warning
    line saying why they are not ranks of one job, and no "busy vs fastest" between them."""
    layout, reason = NOT_ONE_JOB[case]
    files = [
        real_traces[1] if spec is None else _as_rank(real_traces[0], tmp_path / f"t{i}.ets", *spec)
        for i, spec in enumerate(layout)
    ]
    run = ets_hook("info", *files)
    assert run.returncode == 0, run.stderr
    for path in files:
        assert f"{path}" in run.stdout
    assert "per rank" not in run.stdout and "busy vs fastest" not in run.stdout
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("ets-hook info: warning: these traces are not the ranks of one job")
    assert reason.format(*files) in lines[0]
    assert lines[0].endswith("no per-rank comparison")
    as_json = ets_hook("info", "--json", *files)
    assert as_json.returncode == 0 and as_json.stderr == run.stderr
    doc = json.loads(as_json.stdout)
    assert doc["ranks"] == [] and doc["straggler_rank"] is None
    assert reason.format(*files) in doc["not_one_job"]
    assert len(doc["traces"]) == 2


def test_train_on_a_folder_of_bad_traces_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "traces" / "sub" / "broken.ets"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"ETSTRACE" + b"\0" * 7)
    run = ets_hook("train", tmp_path / "traces", "-o", tmp_path / "m.npz")
    assert_input_error(run, "train", bad)


#: (command, args, what the error line must say) for outputs that cannot be written; ``{t}``
#: is a real trace, ``{o}`` an existing folder (and ``{o}.npz`` one too). A path ending with a
#: separator or in ``.`` names a directory: no file is written beside it (``{o}/new.npz``).
OUTPUTS = {
    "export-missing-folder": (
        "export",
        "export {t} --chrome {o}/no-such-dir/c.json",
        "{o}/no-such-dir",
    ),
    "export-folder": ("export", "export {t} --chrome {o}", "{o}: a directory"),
    "export-trailing-slash": (
        "export",
        "export {t} --chrome {o}/new/",
        "{o}/new/: names a directory, not a file to write",
    ),
    "train-folder": ("train", "train {t} -o {o}", "{o}: a directory, cannot write it"),
    "train-npz-folder": ("train", "train {t} -o {o}.npz", "{o}.npz: a directory"),
    "train-trailing-slash": (
        "train",
        "train {t} -o {o}/new/",
        "{o}/new/: names a directory, not a file to write",
    ),
    "train-dot": ("train", "train {t} -o {o}/.", "{o}/.: names a directory, not a file to write"),
    "train-under-a-file": ("train", "train {t} -o {t}/m.npz", "{t} is not a directory"),
    "demo-missing-folder": ("demo", "demo --trace {o}/no-such-dir/d.ets", "{o}/no-such-dir"),
    "demo-folder": ("demo", "demo --trace {o}", "{o}: a directory"),
    "demo-trailing-slash": (
        "demo",
        "demo --steps 10 --model gpt --trace {o}/new/",
        "{o}/new/: names a directory, not a file to write",
    ),
}


@pytest.mark.parametrize("case", OUTPUTS)
def test_an_output_that_cannot_be_written_exits_2_before_any_work(
    case: str, real_traces: list[Path], tmp_path: Path
) -> None:
    command, args, says = OUTPUTS[case]
    (tmp_path / "o.npz").mkdir()  # train -o {o} writes {o}.npz
    names = {"t": real_traces[0], "o": tmp_path / "o"}
    (tmp_path / "o").mkdir()
    run = ets_hook(*args.format(**names).split(), timeout=60)
    assert_input_error(run, command, says.format(**names))
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["o", "o.npz"]


@pytest.mark.parametrize(
    ("output", "says"),
    [("", "-o '': an empty path names no file"), (".", ".: names a directory")],
    ids=["empty", "dot"],
)
def test_train_to_an_output_that_names_no_file_exits_2(
    output: str, says: str, tmp_path: Path
) -> None:
    """``-o ""`` and ``-o .``: one line, not ``Path('.') has an empty name`` in a traceback."""
    run = ets_hook("train", tmp_path / "missing.csv", "-o", output)
    assert_input_error(run, "train", says)


#: Where no file can be created: ``/proc`` is a directory ``os.access`` lets root write, but
#: it takes no new file. (command, args); ``{m}`` is a missing input, checked only after.
PROC_OUTPUTS = {
    "train": "train {m} -o /proc/ets-hook-test/m.npz",
    "export": "export {m} --chrome /proc/ets-hook-test.json",
    "demo": "demo --steps 10 --model gpt --trace /proc/ets-hook-test.ets",
}


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="no /proc")
@pytest.mark.parametrize("command", PROC_OUTPUTS)
def test_an_output_folder_that_takes_no_file_exits_2_before_any_work(
    command: str, tmp_path: Path
) -> None:
    """Refused before the inputs are read or anything is trained (demo: before it trained the
    whole job and then exited 1), naming the output, not a temp file of ets-hook's."""
    args = PROC_OUTPUTS[command].format(m=tmp_path / "missing.ets").split()
    output = args[-1] if command == "demo" else args[3]
    run = ets_hook(*args, timeout=60)
    assert_input_error(run, command, f": error: {output}: ", "/proc")
    assert "missing.ets" not in run.stderr and ".tmp" not in run.stderr


# ---------------------------------------------------------------------------------------------
# usage errors and invalid option values: argparse, exit 2


#: args -> what argparse's error line must say.
USAGE_ERRORS = {
    "demo --steps 5": ["argument --steps", "must be >= 10, got 5"],
    "demo --steps 0": ["argument --steps", "must be >= 10"],
    "demo --device tpu": ["argument --device", "'tpu'"],
    "train x.csv -o m.npz --epochs -1": ["argument --epochs", "must be >= 0"],
    "train x.csv -o m.npz --lr 0": ["argument --lr", "must be in (0, inf)"],
    "train x.csv -o m.npz --val-fraction 1": ["argument --val-fraction", "[0, 1)"],
    "train x.csv -o m.npz --dropout nan": ["argument --dropout", "nan"],
    "train x.csv -o m.npz --width 0": ["argument --width", "must be >= 1"],
    "evaluate m.npz": ["TRACES"],
    "build-ops --frobnicate": ["unrecognized arguments: --frobnicate"],
    # --seed: an int in [0, 2**63 - 1] in every subcommand, the error naming it and the value
    "demo --steps 10 --model gpt --seed -1": ["argument --seed", "got -1"],
    "demo --steps 10 --model gpt --seed 99999999999999999999": [
        "argument --seed",
        "must be in [0, 2**63 - 1], got 99999999999999999999",
    ],
    "demo --steps 10 --model gpt --seed 9223372036854775808": [
        "argument --seed",
        "got 9223372036854775808",
    ],
    "train x.csv -o m.npz --seed -1": ["argument --seed", "must be in [0, 2**63 - 1], got -1"],
    "train x.csv -o m.npz --seed 99999999999999999999": [
        "argument --seed",
        "got 99999999999999999999",
    ],
}


@pytest.mark.parametrize("args", USAGE_ERRORS)
def test_invalid_option_values_are_usage_errors(args: str) -> None:
    assert_usage_error(ets_hook(*args.split()), args.split()[0], *USAGE_ERRORS[args])


def test_a_stride_above_the_width_exits_2_before_loading(tmp_path: Path) -> None:
    run = ets_hook("train", tmp_path / "missing.csv", "-o", tmp_path / "m.npz", "--stride", "5",
                   "--width", "4")  # fmt: skip
    assert_input_error(run, "train", "--stride 5 must be <= --width 4")


# ---------------------------------------------------------------------------------------------
# failures while running: exit 1


def test_build_ops_without_a_compiler_exits_1_with_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {
        **os.environ,
        "PATH": str(empty),
        "CXX": str(empty / "c++"),
        "ETS_HOOK_CACHE_DIR": str(tmp_path / "cache"),
    }
    run = ets_hook("build-ops", "--force", env=env, timeout=300)
    assert run.returncode == 1, (run.stdout, run.stderr)
    assert run.stderr.splitlines() == [
        "ets-hook build-ops: error: no C++ compiler found (set CXX or install g++)"
    ]
    assert run.stdout == ""


@pytest.mark.parametrize(
    ("raised", "code"), [("RuntimeError('boom')", 1), ("KeyboardInterrupt", 130)]
)
def test_an_unexpected_failure_exits_1_with_a_traceback(
    raised: str, code: int, real_traces: list[Path]
) -> None:
    """The console script's ``main`` with the ``info`` table broken (or interrupted) inside."""
    script = (
        "import sys\n"
        "import ets_hook.cli.main as cli\n"
        "def broken(*args, **kwargs):\n"
        f"    raise {raised}\n"
        "cli.format_info = broken\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, "info", str(real_traces[0])],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == code, (run.stdout, run.stderr)
    if code == 1:
        assert run.stderr.startswith("Traceback"), run.stderr
        assert run.stderr.rstrip().endswith("RuntimeError: boom")
    else:
        assert run.stderr == ""
