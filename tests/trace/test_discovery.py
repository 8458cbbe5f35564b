"""trace.discovery: which files paths name (``trace_files``) and loading them (``load_traces``)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from support import ETS_OP_CODES, sample_trace, write_ets_csv

from ets_hook.errors import ETSCSVError, TraceFileError
from ets_hook.trace.discovery import load_traces, trace_files
from ets_hook.trace.events import IterationTrace, OpEvent, Phase, Trace
from ets_hook.trace.io import save_trace


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def _artifact_tree(root: Path) -> Path:
    """An ETS artifact layout: the op-code table, one folder per GPU, and a MANIFEST.csv."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "opCodes.dict").write_text(repr(ETS_OP_CODES))
    write_ets_csv(root / "T4" / "a.1_7.csv", 1, 2)
    write_ets_csv(root / "T4" / "b.2_7.csv", 2, 2)
    write_ets_csv(root / "2080Ti" / "a.3_7.csv", 3, 2)
    (root / "MANIFEST.csv").write_text("gpu,file\n")
    return root


# ---------------------------------------------------------------------------------------------
# trace_files


def test_a_file_is_taken_whatever_its_suffix(tmp_path: Path) -> None:
    odd = [_touch(tmp_path / name) for name in ("run.bin", "notes.txt", "noext", "MANIFEST.csv")]
    for path in odd:
        assert trace_files([path]) == [path]
    assert trace_files([str(odd[0])]) == [odd[0]]  # strings are paths too


def test_folders_hold_only_trace_suffixes_and_skip_the_manifest(tmp_path: Path) -> None:
    wanted = [_touch(tmp_path / n) for n in ("a.csv", "b.ets", "c.CSV", "d.ETS")]
    for name in ("MANIFEST.csv", "opCodes.dict", "model.npz", "readme.txt", "trace.ets.tmp"):
        _touch(tmp_path / name)
    (tmp_path / "folder.csv").mkdir()  # a folder named like a trace is searched, not taken
    inner = _touch(tmp_path / "folder.csv" / "inner.ets")
    assert trace_files([tmp_path]) == sorted([*wanted, inner])


def test_order_follows_the_paths_with_each_folder_sorted(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    for name in ("z.ets", "a.csv", "m/deep/x.ets", "b/y.csv"):
        _touch(folder / name)
    first = _touch(tmp_path / "zz.ets")
    last = _touch(tmp_path / "aa.csv")
    assert trace_files([first, folder, last]) == [
        first,
        folder / "a.csv",
        folder / "b" / "y.csv",
        folder / "m" / "deep" / "x.ets",
        folder / "z.ets",
        last,
    ]


def test_missing_path_raises_naming_it(tmp_path: Path) -> None:
    _touch(tmp_path / "there.ets")
    missing = tmp_path / "missing.csv"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        trace_files([tmp_path / "there.ets", missing])
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        load_traces([missing])


def test_a_fifo_is_left_to_the_loader_to_refuse(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.ets"
    os.mkfifo(fifo)
    assert trace_files([fifo]) == [fifo]  # it exists: not "no such file"


def test_a_folder_without_traces_is_an_error_naming_it(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(
        FileNotFoundError, match=rf"{re.escape(str(empty))}: .* without \.csv or \.ets"
    ):
        load_traces([empty])
    _touch(empty / "MANIFEST.csv")  # the manifest alone is not a trace
    _touch(empty / "opCodes.dict")
    with pytest.raises(FileNotFoundError, match=re.escape(str(empty))):
        trace_files([empty])


# ---------------------------------------------------------------------------------------------
# load_traces


def test_folders_load_in_sorted_order_with_device_from_the_folder(tmp_path: Path) -> None:
    root = _artifact_tree(tmp_path)
    traces = load_traces([root])
    assert [(t.device.name, t.metadata["file"]) for t in traces] == [
        ("2080Ti", "a.3_7.csv"),
        ("T4", "a.1_7.csv"),
        ("T4", "b.2_7.csv"),
    ]


def test_device_name_override_and_the_op_code_table_near_the_file(tmp_path: Path) -> None:
    root = _artifact_tree(tmp_path)
    (single,) = load_traces([root / "T4" / "b.2_7.csv"], device_name="T4-override")
    assert single.device.name == "T4-override"
    assert single.iterations[0].ops[0].name == "conv2d"  # opCodes.dict one folder up
    (renamed,) = load_traces([root / "T4" / "b.2_7.csv"], op_codes={203: "my_conv"})
    assert renamed.device.name == "T4"
    assert renamed.iterations[0].ops[0].name == "my_conv"


def test_ets_trace_files_are_loaded_through_trace_io(tmp_path: Path) -> None:
    ops = [
        OpEvent(
            "aten::relu",
            1000 * k,
            400,
            phase=Phase.FORWARD,
            input_shapes=((8, 8),),
            input_dtypes=("float",),
        )
        for k in range(20)
    ]
    trace = Trace(iterations=[IterationTrace(0, 0, 20_000, ops)], metadata={"model": "toy"})
    save_trace(trace, tmp_path / "toy.ets")
    (loaded,) = load_traces([tmp_path])
    assert loaded.metadata["file"] == "toy.ets"
    assert len(loaded.iterations[0].ops) == 20


def test_any_non_csv_file_is_read_as_an_ets_trace_and_keeps_its_own_file_name(
    tmp_path: Path,
) -> None:
    trace = sample_trace()
    save_trace(trace, tmp_path / "capture.bin")
    named = sample_trace()
    named.metadata["file"] = "original.ets"
    save_trace(named, tmp_path / "copy.ets")
    plain, kept = load_traces([tmp_path / "capture.bin", tmp_path / "copy.ets"])
    assert plain.metadata["file"] == "capture.bin"
    assert kept.metadata["file"] == "original.ets"  # a file's own "file" entry wins
    assert plain.device.name == trace.device.name
    assert [len(it.ops) for it in plain.iterations] == [len(it.ops) for it in trace.iterations]


def test_malformed_files_raise_their_reader_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.ets").write_bytes(b"not a trace at all")
    with pytest.raises(TraceFileError, match=r"bad\.ets"):
        load_traces([tmp_path / "bad.ets"])
    (tmp_path / "bad.1_7.csv").write_text("op,dir\n1,2\n")
    with pytest.raises(ETSCSVError, match=r"bad\.1_7\.csv"):
        load_traces([tmp_path / "bad.1_7.csv"], op_codes={})
