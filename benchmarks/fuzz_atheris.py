"""Coverage-guided fuzzing of one trace-file loader with atheris (libFuzzer), issue 13.

The long companion of ``fuzz_loaders.py``, whose mutators are random and blind: here libFuzzer
mutates the inputs and keeps those that reach new lines and branches of the instrumented
``ets_hook.trace`` modules (``io``, ``untrusted``, ``importers``, ``events``, ``summary``).
The check is fuzz_loaders' own: an input must load or raise ``TraceFileError``, and a loaded
trace must print as ``ets-hook info`` prints it and save again. Any other exception is a crash:
libFuzzer stops and writes the input to ``<workdir>/<loader>/artifacts/crash-<sha1>``.

- ``ets``: ``trace.io.loads``. Each input runs twice: as is, and with the header's length and
  CRC32 recomputed (libFuzzer would almost never guess a checksum, so the payload's decoding
  and validation would stay out of reach).
- ``csv`` / ``opcodes``: the input is written to ``fuzz.1_7.csv`` / ``opCodes.dict`` and read
  by ``trace.importers.read_ets_csv`` / ``load_op_codes``.

The corpus starts from fuzz_loaders' valid files, written to ``<workdir>/<loader>/corpus``;
libFuzzer adds what it finds there, so a later run continues from it. libFuzzer ends the process
when done, so it runs in a child process and this one reports: runs, crashes, peak RSS, and
libFuzzer's coverage (``cov``: instrumented edges reached, ``ft``: features). Exit status: 0,
1 on a crash (or timeout, out-of-memory), 2 when atheris is not installed.

atheris is optional, not a dependency of ets-hook (``pip install atheris``).

Usage::

    python benchmarks/fuzz_atheris.py --loader ets|csv|opcodes [--seconds 60]
        [--rss-limit-mb 2048] [--timeout 10] [--max-len 65536] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

LOADERS = ("ets", "csv", "opcodes")
#: Files libFuzzer writes for a failing input.
FAILURES = ("crash-", "timeout-", "oom-", "leak-")


def seed_files(loader: str, max_len: int) -> list[bytes]:
    """fuzz_loaders' valid inputs for ``loader`` (those up to ``max_len`` bytes)."""
    import fuzz_loaders as fl

    rng = random.Random(0)
    if loader == "ets":
        ets = fl.EtsInputs(rng)
        seeds = [fl.trace_io.dumps(fl.seed_trace(1, 1)), ets.small, ets.medium, ets.large]
    elif loader == "csv":
        rows = fl.CsvInputs(rng).rows
        seeds = [fl._csv_text(rows[:3]).encode(), fl._csv_text(rows, "\n").encode()]
    else:
        seeds = [fl.OpCodesInputs(rng).seed.encode()]
    return [seed for seed in seeds if len(seed) <= max_len]


def libfuzzer_args(args: argparse.Namespace, folder: Path) -> list[str]:
    return [
        str(folder / "corpus"),
        f"-max_total_time={args.seconds}",
        f"-rss_limit_mb={args.rss_limit_mb}",
        f"-timeout={args.timeout}",
        f"-max_len={args.max_len}",
        f"-artifact_prefix={folder / 'artifacts'}/",
        "-print_final_stats=1",
    ]


def fuzz_in_this_process(args: argparse.Namespace, folder: Path) -> None:
    """The child: instrument the loaders, then hand the process to libFuzzer (never returns)."""
    import atheris

    assert "ets_hook" not in sys.modules, "imported before instrumentation: no coverage"
    with atheris.instrument_imports(include=["ets_hook.trace"]):
        from ets_hook.trace import importers, io, summary  # noqa: F401  (instrumented here)
    import fuzz_loaders as fl

    from ets_hook.errors import TraceFileError

    logging.disable(logging.WARNING)  # the importers warn on FP16 rows
    warnings.simplefilter("ignore")  # literal_eval's SyntaxWarnings on hostile literals
    loaders = fl.current_loaders()
    path = folder / "scratch" / ("fuzz.1_7.csv" if args.loader == "csv" else "opCodes.dict")
    path.parent.mkdir(exist_ok=True)

    def with_checksum(data: bytes) -> bytes:
        _, version, flags, _, _ = fl.HEADER.unpack_from(data)
        return fl.wrap(data[fl.HEADER.size :], version=version, flags=flags)

    def one_input(data: bytes) -> None:
        inputs = [data]
        if args.loader != "ets":
            path.write_bytes(data)
        elif len(data) >= fl.HEADER.size and (fixed := with_checksum(data)) != data:
            inputs.append(fixed)
        for item in inputs:  # fuzz_loaders' check: load, print, save; typed errors only
            with contextlib.suppress(TraceFileError):
                fl._runner(args.loader, loaders, item, path)()

    atheris.Setup([sys.argv[0], *libfuzzer_args(args, folder)], one_input)
    atheris.Fuzz()


def run_child(argv: list[str], on_line: Callable[[str], None]) -> int:
    """Run this script with ``--child``, passing each output line to ``on_line``."""
    command = [sys.executable, __file__, *argv, "--child"]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as child:
        assert child.stdout is not None
        try:
            for line in child.stdout:
                on_line(line)
        except KeyboardInterrupt:  # the child got it too: libFuzzer stops and prints its stats
            pass
        return child.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loader", choices=LOADERS, required=True)
    parser.add_argument("--seconds", type=int, default=60, help="libFuzzer -max_total_time")
    parser.add_argument("--rss-limit-mb", type=int, default=2048, help="libFuzzer -rss_limit_mb")
    parser.add_argument("--timeout", type=int, default=10, help="seconds per input (-timeout)")
    parser.add_argument("--max-len", type=int, default=65536, help="largest input (-max_len)")
    parser.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "ets-fuzz-atheris"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    try:
        importlib.import_module("atheris")
    except ImportError:
        print(
            "fuzz_atheris.py: atheris is not installed (optional): pip install atheris",
            file=sys.stderr,
        )
        return 2
    folder = args.workdir / args.loader
    if args.child:
        fuzz_in_this_process(args, folder)
    for name in ("corpus", "artifacts"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    for index, seed in enumerate(seed_files(args.loader, args.max_len)):
        (folder / "corpus" / f"seed-{index}").write_bytes(seed)
    before = set((folder / "artifacts").iterdir())

    stats: dict[str, str] = {}

    def on_line(line: str) -> None:
        sys.stdout.write(line)
        if match := re.match(r"stat::(\w+):\s*(\d+)", line):
            stats[match[1]] = match[2]
        if match := re.match(r"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)", line):
            stats.update(runs=match[1], cov=match[2], ft=match[3], corpus=match[4])
        if match := re.search(r"exec/s: (\d+)", line):
            stats["exec_s"] = match[1]
        if match := re.match(r"Done (\d+) runs in (\d+) second", line):
            stats.update(runs=match[1], seconds=match[2])

    started = time.monotonic()
    code = run_child(argv, on_line)
    seconds = stats.get("seconds", f"{time.monotonic() - started:.0f}")
    new = set((folder / "artifacts").iterdir()) - before
    failures = sorted(path for path in new if path.name.startswith(FAILURES))
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux
    runs = stats.get("number_of_executed_units", stats.get("runs", "?"))
    print(
        f"== atheris {args.loader}: {runs} runs in {seconds} s "
        f"({stats.get('exec_s', '?')}/s), crashes {len(failures)}, peak RSS {peak_mb:.0f} MB"
    )
    print(
        f"   libFuzzer: cov {stats.get('cov', '?')}, ft {stats.get('ft', '?')}, corpus "
        f"{stats.get('corpus', '?')} inputs in {folder / 'corpus'} "
        f"({stats.get('new_units_added', '?')} units added this run)"
    )
    for failure in failures:
        print(f"   FAILED: {failure}")
    return 1 if failures or code else 0


if __name__ == "__main__":
    sys.exit(main())
