"""Helpers shared by test modules (importable because pytest puts ``tests/`` on the path)."""

from __future__ import annotations

import csv
import re
import shutil
import socket
import sys
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ets_hook.forecast.early_stop import MIN_POINTS
from ets_hook.forecast.prediction import Prediction
from ets_hook.trace.events import (
    CaptureInfo,
    DeviceInfo,
    IterationTrace,
    KernelEvent,
    KernelKind,
    OpEvent,
    Phase,
    Trace,
)
from ets_hook.trace.importers import ETS_CSV_COLUMNS

if TYPE_CHECKING:
    import pytest
    import torch

    from ets_hook.forecast.forecaster import Forecaster

#: ``../shared/data`` beside the checkout: third-party data that optional tests read by path.
#: The ``ets-hook`` console script installed beside this interpreter (the venv's ``bin``).
ETS_HOOK = shutil.which("ets-hook", path=str(Path(sys.executable).parent))

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
#: The checkout's root (README.md, benchmarks/).
REPO = Path(__file__).resolve().parents[1]


def sample_prediction(**overrides: Any) -> Prediction:
    """A converged prediction at step 30 of 2000 (0.412 s/step ±1.1%, ETA 812 s, total 825 s);
    ``overrides`` replace fields."""
    fields: dict[str, Any] = {
        "step": 30,
        "total_steps": 2000,
        "remaining_steps": 1970,
        "iteration_s": 0.412,
        "iteration_ci_s": 0.011 * 0.412,
        "total_s": 825.0,
        "total_ci_s": 9.0,
        "eta_s": 812.0,
        "elapsed_s": 13.0,
        "finish_time": None,
        "converged": True,
        "source": "measured",
    }
    fields.update(overrides)
    return Prediction(**fields)


def status_prediction(step: int = 300, iteration_s: float = 0.412) -> Prediction:
    """A converged, measured prediction of a 2000-step job at ``step`` (130 s elapsed), as a
    status file shows it."""
    eta = (2000 - step) * iteration_s
    return Prediction(
        step=step,
        total_steps=2000,
        remaining_steps=2000 - step,
        iteration_s=iteration_s,
        iteration_ci_s=iteration_s * 0.011,
        total_s=130.0 + eta,
        total_ci_s=20.0,
        eta_s=eta,
        elapsed_s=130.0,
        finish_time=datetime.now(timezone.utc) + timedelta(seconds=eta),
        converged=True,
        source="measured",
    )


def sample_trace() -> Trace:
    ops = [
        OpEvent(
            "aten::linear",
            1_000,
            500,
            thread=1,
            phase=Phase.FORWARD,
            input_shapes=((32, 64), (128, 64), (128,)),
            input_dtypes=("float",) * 3,
            sequence_nr=7,
            gap_ns=20,
        ),
        OpEvent(
            "aten::addmm",
            1_100,
            300,
            thread=1,
            phase=Phase.FORWARD,
            depth=1,
            parent=0,
            input_shapes=((128,), (32, 64), (64, 128)),
            input_dtypes=("float",) * 3,
        ),
        OpEvent(
            "autograd::engine::evaluate_function: AddmmBackward0",
            2_000,
            900,
            thread=2,
            phase=Phase.BACKWARD,
            kernel_duration_ns=400,
            kernel_count=2,
            gap_ns=0,
        ),
        OpEvent(
            "aten::add_",
            3_000,
            50,
            thread=1,
            phase=Phase.OPTIMIZER,
            flops=128,
            bytes_moved=1024,
            params=(1, 2, 3),
        ),
    ]
    kernels = [
        KernelEvent(
            "volta_sgemm_128x64_nn",
            1_200,
            250,
            device=0,
            stream=7,
            correlation_id=11,
            op_index=1,
            grid=(4, 2, 1),
            block=(256, 1, 1),
        ),
        KernelEvent(
            "Memcpy HtoD",
            1_500,
            30,
            kind=KernelKind.MEMCPY,
            stream=7,
            correlation_id=12,
            bytes=4096,
        ),
        KernelEvent(
            "ncclDevKernel_AllReduce",
            2_100,
            700,
            stream=9,
            correlation_id=13,
            op_index=2,
            communication=True,
        ),
    ]
    iterations = [
        IterationTrace(step=1, start_ns=900, end_ns=3_200, ops=ops, kernels=kernels),
        IterationTrace(step=2, start_ns=3_200, end_ns=5_000),
    ]
    return Trace(
        iterations=iterations,
        device=DeviceInfo(kind="cuda", name="Test GPU", index=0, uuid="GPU-1234"),
        capture=CaptureInfo(skip_steps=1, capture_steps=2, op_capture="test", dropped_records=3),
        torch_version="2.13.0",
        ets_hook_version="0.1.0",
        step_times_s=[0.5, 0.25, 0.24],
        rank=1,
        world_size=2,
        metadata={"model": "MLP", "batch_size": 32, "tags": ["a", "b"]},
    )


# ---------------------------------------------------------------------------------------------
# Synthetic ETS-artifact CSV traces (train / evaluate / discovery)

#: The op-code table (``opCodes.dict``) of the synthetic CSVs written by ``write_ets_csv``.
ETS_OP_CODES = {"conv2d": 203, "relu": 152, "add_": 12}


def write_ets_csv(path: Path, batch: int, n_layers: int) -> None:
    """One synthetic ETS-artifact iteration: conv/relu forward and backward, then add_ updates."""
    rows = []
    t = 0
    plan = [(203, 1), (152, 1)] * n_layers + [(152, 2), (203, 2)] * n_layers + [(12, 3)] * n_layers
    for k, (op, direction) in enumerate(plan):
        kdur = (3000 if op == 203 else 400) * batch * (2 if direction == 2 else 1)
        space = 2000 + 100 * (k % 3)
        params = [batch, 8, 16, 16, 8, 16, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 4] + [0] * 13
        row = dict.fromkeys(ETS_CSV_COLUMNS, 0)
        row.update(
            op=op,
            dir=direction,
            params=str(params),
            flops=float(1e6 * batch),
            bytes=4e5 * batch,
            rStartTime=t,
            rEndTime=t + 100,
            kStartTime=t + 50,
            kEndTime=t + 50 + kdur,
            space=space,
            seq=k,
            kernels=1,
            kduration=kdur,
            batch=batch,
            h=16,
            w=16,
            input_type=1,
        )
        rows.append(row)
        t += kdur + space
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(ETS_CSV_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)


#: (model, layers) of the synthetic models ``write_ets_tree`` writes, each at batch 1, 2 and 4.
ETS_MODELS = (("net_a", 3), ("net_b", 5), ("net_c", 4))


def write_ets_tree(root: Path, gpu: str = "T4") -> Path:
    """``root/opCodes.dict`` and ``root/<gpu>/<model>.<batch>_7.csv`` for ``ETS_MODELS``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "opCodes.dict").write_text(repr(ETS_OP_CODES))
    for model, layers in ETS_MODELS:
        for batch in (1, 2, 4):
            write_ets_csv(root / gpu / f"{model}.{batch}_7.csv", batch, layers)
    return root


# ---------------------------------------------------------------------------------------------
# Reporters

#: One formatted prediction line (``format_prediction``) with a known total.
PREDICTION_LINE = re.compile(
    r"^step \d+/\d+ · [\d.]+ (s|ms|µs)/step ±[\d.]+% · ETA [\dmshd.]+ · total [\dmshd.]+$"
)


def run_job(
    forecaster: Forecaster,
    n: int,
    step_s: float | np.ndarray,
    *,
    cv: float = 0.03,
    seed: int = 0,
    on_step: Any = None,
) -> float:
    """Drive ``forecaster`` through ``n`` steps of (noisy) ``step_s``; returns the end time."""
    rng = np.random.default_rng(seed)
    base = np.broadcast_to(np.asarray(step_s, dtype=float), (n,))
    now = 0.0
    for i in range(n):
        d = float(base[i] * (1.0 + cv * rng.standard_normal()))
        now += d
        forecaster.on_step_end(i, d, now)
        if on_step is not None:
            on_step(i, now)
    return now


def log_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The messages logged on the ``ets_hook`` logger."""
    return [r.getMessage() for r in caplog.records if r.name == "ets_hook"]


def call_in_thread(call: Any, timeout: float = 20.0) -> Any:
    """Run ``call`` in a daemon thread: its result or exception, or fail if it blocks."""
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["result"] = call()
        except BaseException as exc:  # handed back to the test
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"{call} still blocked after {timeout} s"
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["result"]


def readme_python_blocks(title: str, language: str = "python") -> list[str]:
    """The ```python blocks (```yaml with ``language="yaml"``, ...) of README.md's section
    headed ``title`` (up to the next heading outside a code block). Fails the test when
    README.md has no such section."""
    section: list[str] = []
    inside = fenced = False
    for line in (REPO / "README.md").read_text().splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            if inside:
                break
            inside = line.lstrip("#").strip() == title
            continue
        if inside:
            section.append(line)
    assert section, f"README.md has no section {title!r}"
    pattern = rf"^```{re.escape(language)}\n(.*?)^```"
    return re.findall(pattern, "".join(section), re.DOTALL | re.MULTILINE)


def tiny_regression_job(
    optimizer_class: type[torch.optim.Optimizer], batches: int
) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader]:
    """A small MLP (seeded), its optimizer of ``optimizer_class`` (lr 0.01) and a loader of
    ``batches`` batches of 4 random regression samples (the plain-loop integrations' jobs;
    imports torch: call it only from tests that use it)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = optimizer_class(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(4 * batches, 8), torch.randn(4 * batches, 1))
    return model, optimizer, torch.utils.data.DataLoader(data, batch_size=4)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a job's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Seen:
    """A framework callback's prediction right after its hook took in an evaluation of the
    monitored metric (the early-stopping tests of tests/integrations)."""

    step: int  # the trainer's global step then
    evaluations: int  # evaluations the hook's early-stopping tracker has seen
    prediction: Any


def check_forecasts_until_the_stop(
    seen: list[Seen], max_steps: int, stop_step: int, keeps_improving: bool = False
) -> None:
    """The early-stop forecast at each evaluation before ``stop_step`` (the step the run
    really ended at), against what ``Prediction`` and ``forecast.early_stop`` promise.

    None before ``MIN_POINTS`` evaluations; from then on an expected stop after the current
    step and at most ``max_steps`` (exactly ``max_steps`` for a monitor that ``keeps_improving``:
    a curve that keeps improving is forecast to run to the end), and ``total_range_s`` = (total
    if the job stops there, ``total_s``): not before now, low < high exactly when the stop is
    expected before ``max_steps``.
    """
    assert [s.evaluations for s in seen] == list(range(1, len(seen) + 1))  # each one taken in
    before = [s for s in seen if s.step < stop_step]
    assert len([s for s in before if s.evaluations >= MIN_POINTS]) >= 2, seen
    for s in before:
        prediction = s.prediction
        assert prediction is not None and prediction.step == s.step
        if s.evaluations < MIN_POINTS:
            assert prediction.expected_stop_step is None and prediction.total_range_s is None
            continue
        assert s.step < prediction.expected_stop_step <= max_steps, s
        if keeps_improving:
            assert prediction.expected_stop_step == max_steps, s
        assert prediction.total_range_s is not None
        low_s, high_s = prediction.total_range_s
        assert high_s == prediction.total_s
        assert prediction.elapsed_s <= low_s <= high_s
        if prediction.expected_stop_step < max_steps:
            assert low_s < high_s, s
        else:
            assert low_s == high_s, s


def quiet_lightning_trainer(**kwargs: Any) -> Any:
    """A Lightning ``Trainer`` on one CPU device with no model summary, progress bar,
    checkpointing or logger unless ``kwargs`` say otherwise (imports Lightning: call it only
    from tests that need it)."""
    import lightning.pytorch as L

    defaults: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "enable_model_summary": False,
        "enable_progress_bar": False,
        "enable_checkpointing": False,
        "logger": False,
    }
    return L.Trainer(**{**defaults, **kwargs})
