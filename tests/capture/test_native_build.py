"""The extension builds without CUPTI headers and says so.

Builds csrc/ with setup.py into a temporary folder (CUDA_HOME -> an empty folder and
ETS_HOOK_NO_CUPTI=1 so the toolkit in /usr/local/cuda is not picked up either; -O0 to keep it
quick) and imports the result in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHECK = textwrap.dedent(
    """
    import importlib.util, json, sys
    spec = importlib.util.spec_from_file_location("ets_hook._C", sys.argv[1])
    C = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(C)
    ring = C.RingBuffer(8)
    pushed = C._testing.push_sequence(ring, 0, 10)
    out = ring.drain()
    print(json.dumps({
        "compiled": C._testing.CUPTI_COMPILED,
        "probe": C.cupti_probe([]),
        "start": C.cupti_start(C.RingBuffer(4), 1 << 16, 4, ["kernel"]),
        "stop": C.cupti_stop(),
        "pushed": pushed,
        "dropped": ring.dropped,
        "starts": out["start_ns"].tolist(),
        "push_external_id": C.push_external_id(1),
        "pop_external_id": C.pop_external_id(),
        "timestamp": C.cupti_timestamp_ns(),
        "has_fake": hasattr(C._testing, "install_fake_cupti"),
    }))
    """
)


@pytest.mark.slow
def test_build_without_cupti_headers(tmp_path: Path) -> None:
    empty_cuda = tmp_path / "empty-cuda"
    empty_cuda.mkdir()
    env = dict(os.environ)
    env.update(
        CUDA_HOME=str(empty_cuda),
        CUDA_PATH=str(empty_cuda),
        ETS_HOOK_NO_CUPTI="1",
        ETS_HOOK_DEBUG="1",
        MAX_JOBS="2",
    )
    build = subprocess.run(
        [
            sys.executable, "setup.py", "-q", "build_ext",
            "--build-lib", str(tmp_path / "lib"), "--build-temp", str(tmp_path / "tmp"),
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    assert "CUPTI disabled" in build.stdout
    libs = list((tmp_path / "lib" / "ets_hook").glob("_C*.so"))
    assert len(libs) == 1

    run = subprocess.run(
        [sys.executable, "-c", CHECK, str(libs[0])],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["compiled"] is False
    code, reason = result["probe"]
    assert code == "no_headers"
    assert "built without CUPTI headers" in reason
    assert result["start"][0] == "no_headers"
    assert result["stop"][0] == "ok"
    # the ring and the rest of the extension work as usual
    assert (result["pushed"], result["dropped"], result["starts"]) == (8, 2, list(range(8)))
    assert result["push_external_id"] is False
    assert result["pop_external_id"] is None
    assert result["timestamp"] == -1
    assert result["has_fake"] is False
