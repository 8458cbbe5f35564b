"""``kill -9`` a status-file writer again and again: is the file always valid, and are temp files
of killed writers cleaned up?

Each run starts a real training loop with ``ETSHook(status_path=..., status interval 0.01 s)``
(a tiny model, so the status file is rewritten about every step), waits until it has written
once, lets it run a random 0-200 ms more and sends it SIGKILL. After every kill the status file
must parse as JSON and name a state of the schema. After all runs, one normal run (closes) is
started; then the folder must hold only the status file.

Reported: runs, invalid status files seen, temp files left after the kills (before the normal
run) and after it. Usage::

    python benchmarks/kill_loop.py [--runs 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

JOB = textwrap.dedent(
    """
    import sys, torch
    from ets_hook import ETSHook
    from ets_hook.reporters import status_file
    mode, path = sys.argv[1], sys.argv[2]
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hook = ETSHook(model, optimizer=opt, total_steps=10**9, capture_steps=0, log_every=None,
                   status_path=path)
    for reporter in hook._forecaster._dispatch.reporters:  # rewrite about every step
        if isinstance(reporter, status_file.StatusFileReporter):
            reporter.schedule = status_file.ReportSchedule(first_steps=1, interval_s=0.001)
    step = 0
    while mode == "loop" or step < 50:
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        step += 1
        if step == 20:
            print("ready", flush=True)
    hook.close()
    """
)
STATES = ("running", "closed", "interrupted", "failed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        status = folder / "eta.json"
        invalid = 0
        for run in range(args.runs):
            proc = subprocess.Popen(
                [sys.executable, "-c", JOB, "loop", str(status)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                proc.kill()
                raise SystemExit(f"run {run}: the job did not start")
            time.sleep(rng.uniform(0.0, 0.2))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            try:
                doc = json.loads(status.read_text())
                invalid += doc.get("state") not in STATES
            except (OSError, ValueError):
                invalid += 1
        left_after_kills = len(list(folder.glob(".eta.json.*.tmp")))
        subprocess.run(
            [sys.executable, "-c", JOB, "once", str(status)], check=True, stdout=subprocess.DEVNULL
        )
        left_after_normal = sorted(p.name for p in folder.iterdir() if p.name != "eta.json")
        final_state = json.loads(status.read_text())["state"]
    result = {
        "runs": args.runs,
        "invalid_status_files": invalid,
        "temp_files_after_kills": left_after_kills,
        "files_left_after_one_normal_run": left_after_normal,
        "final_state": final_state,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    return 0 if not invalid and not left_after_normal and final_state == "closed" else 1


if __name__ == "__main__":
    sys.exit(main())
