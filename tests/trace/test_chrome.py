"""Chrome/Perfetto export and the `ets-hook info/export` commands."""

from __future__ import annotations

import json

from support import sample_trace

from ets_hook.cli.main import main
from ets_hook.trace.chrome import chrome_events, export_chrome
from ets_hook.trace.io import save_trace
from ets_hook.trace.summary import summarize_iteration


def test_chrome_export_is_valid_json_with_monotonic_timestamps_and_one_flow_per_kernel(tmp_path):
    trace = sample_trace()
    path = export_chrome(trace, tmp_path / "out.json")
    document = json.loads(path.read_text())
    events = document["traceEvents"]
    timed = [e for e in events if e["ph"] != "M"]
    stamps = [e["ts"] for e in timed]
    assert stamps == sorted(stamps) and min(stamps) >= 0
    correlated = [k for it in trace.iterations for k in it.kernels if k.op_index >= 0]
    starts = [e for e in timed if e["ph"] == "s"]
    finishes = [e for e in timed if e["ph"] == "f"]
    assert len(starts) == len(finishes) == len(correlated)
    assert sorted(e["id"] for e in starts) == sorted(e["id"] for e in finishes)
    assert len({e["id"] for e in starts}) == len(starts)
    ops = [e for e in timed if e.get("cat") == "op"]
    kernels = [e for e in timed if e.get("cat") in ("kernel", "memcpy", "memset")]
    assert len(ops) == sum(len(it.ops) for it in trace.iterations)
    assert len(kernels) == sum(len(it.kernels) for it in trace.iterations)
    assert {e["tid"] for e in kernels} == {7, 9}, "kernels sit on their streams"
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert "host" in names and any(n.startswith("GPU 0") for n in names)


def test_empty_trace_exports_no_events():
    from ets_hook.trace.events import Trace

    assert chrome_events(Trace()) == []


def test_info_prints_a_row_per_step(tmp_path, capsys):
    trace = sample_trace()
    path = save_trace(trace, tmp_path / "t.ets")
    assert main(["info", str(path)]) == 0
    out = capsys.readouterr().out
    # Steps 1 and 2 of the trace (0-based), shown counted from 1 as the log counts them.
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["2"], ["3"])]
    assert [row[0] for row in rows] == ["2", "3"]
    summary = summarize_iteration(trace.iterations[0])
    assert rows[0][2] == str(summary.ops) and rows[0][4] == str(summary.kernels)
    assert summary.correlated_kernels == 2
    assert summary.gpu_ms == (250 + 30 + 700) / 1e6


def test_info_json_and_export(tmp_path, capsys):
    path = save_trace(sample_trace(), tmp_path / "t.ets")
    assert main(["info", str(path), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert [it["step"] for it in payload["iterations"]] == [1, 2]
    out = tmp_path / "c.json"
    assert main(["export", str(path), "--chrome", str(out)]) == 0
    assert json.loads(out.read_text())["traceEvents"]


def test_unreadable_trace_is_a_clean_error(tmp_path, capsys):
    bad = tmp_path / "bad.ets"
    bad.write_bytes(b"garbage")
    assert main(["info", str(bad)]) == 2
    assert "not an ets-hook trace" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "missing.ets")]) == 2


def test_step_slices_are_counted_from_1_as_info_counts_them():
    events = chrome_events(sample_trace())  # iterations of steps 1 and 2 (0-based)
    assert [e["name"] for e in events if e.get("cat") == "step"] == ["step 2", "step 3"]
    assert {e["args"]["step"] for e in events if e.get("cat") == "op"} == {2}
