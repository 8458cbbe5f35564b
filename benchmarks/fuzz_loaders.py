"""Fuzzing the trace-file loaders with hostile input (issue 13, "Hardening").

Three loaders, each fed ``--inputs`` inputs made by a seeded random mutator:

- ``ets``: ``trace.io.loads`` on ``.ets`` contents: random bytes, truncations and bit flips of a
  valid file, payload bit flips and byte edits with the checksum recomputed, structured
  mutations (a valid container, header and checksum recomputed, whose payload has fields
  replaced by hostile values, deleted, extended, or spliced with raw msgpack such as container
  bombs, deep nests and extension types), column blobs with wrong lengths or extreme values,
  and header fields changed.
- ``csv``: ``trace.importers.read_ets_csv`` on paper-artifact CSV files: hostile cells (huge,
  non-finite, non-numeric, over the csv field limit, quotes, NUL), rows and headers of the
  wrong shape, invalid UTF-8, other encodings and line endings, truncations, random bytes.
- ``opcodes``: ``trace.importers.load_op_codes`` on ``opCodes.dict`` files: hostile literals
  (unhashable or odd keys, bools, floats, deep unary chains, deep parentheses, huge ints,
  surrogates), byte edits, truncations, random bytes.

An input must either load or raise the loader's typed error (``TraceFileError``, of which
``ETSCSVError`` is a subclass). A loaded trace must then print as ``ets-hook info`` prints it
(``summary.format_info`` and the ``--json`` document) and save again (``io.dumps``). Anything
else is an escape. Reported per loader: inputs run, how many loaded, rejections per error class,
escaped exception classes (with an example), the peak tracemalloc allocation of one input of at
most 1 MB (every other input runs traced; the file read is included for csv/opcodes), and the
largest wall time of one input (measured on the untraced inputs).

``--against baseline`` (or ``both``) runs the same inputs against the loaders as committed at
``--rev`` (default ``HEAD``), copied out of git into a temporary folder with their relative
imports pointed at the installed package, for before/after failure classes.

Usage::

    python benchmarks/fuzz_loaders.py [--inputs 100000] [--seed 0] [--loaders ets,csv,opcodes]
                                      [--against current|baseline|both] [--rev HEAD]
                                      [--no-tracemalloc] [--json out.json]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.util
import io
import json
import logging
import math
import random
import re
import subprocess
import sys
import tempfile
import time
import tracemalloc
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import msgpack
import numpy as np

from ets_hook.errors import ETSCSVError, TraceFileError
from ets_hook.trace import importers, summary
from ets_hook.trace import io as trace_io
from ets_hook.trace.events import (
    CaptureInfo,
    DeviceInfo,
    HostInfo,
    IterationTrace,
    KernelEvent,
    KernelKind,
    OpEvent,
    Phase,
    Trace,
)

ROOT = Path(__file__).resolve().parents[1]
LOADERS = ("ets", "csv", "opcodes")
#: Inputs above this size are left out of the peak-memory figure (the bound is for small files).
PEAK_INPUT_LIMIT = 1 << 20
HEADER = trace_io._HEADER

# ---------------------------------------------------------------------------------------------
# Seeds: valid inputs to mutate


def seed_trace(n_ops: int = 6, n_iterations: int = 2) -> Trace:
    """A valid trace using every part of the format (kernels, signatures, params, metadata)."""
    iterations = []
    for step in range(n_iterations):
        base = 1_000_000 * (step + 1)
        ops = [
            OpEvent(
                f"aten::op{i % 7}",
                base + 100 * i,
                80,
                thread=1 + i % 2,
                phase=list(Phase)[i % 4],
                depth=0 if i % 3 == 0 else 1,
                parent=-1 if i % 3 == 0 else i - i % 3,
                sequence_nr=i,
                input_shapes=((32, 64 + i % 5), ()),
                input_dtypes=("float", "int"),
                flops=1000 * i,
                bytes_moved=-1,
                params=(i % 4, 2, 3) if i % 2 else (),
                kernel_duration_ns=50 if i % 3 == 0 else -1,
                kernel_count=1,
                gap_ns=10,
            )
            for i in range(n_ops)
        ]
        kernels = [
            KernelEvent(
                f"kernel_{i % 5}",
                base + 100 * i + 10,
                40,
                kind=list(KernelKind)[i % 3],
                device=0,
                stream=7,
                correlation_id=i,
                op_index=i if i % 4 else -1,
                grid=(i, 1, 1),
                block=(128, 1, 1),
                bytes=64 * (i % 3),
                communication=i % 5 == 4,
            )
            for i in range(n_ops)
        ]
        iterations.append(
            IterationTrace(
                step=step, start_ns=base, end_ns=base + 100 * n_ops + 500, ops=ops, kernels=kernels
            )
        )
    return Trace(
        iterations=iterations,
        device=DeviceInfo(kind="cuda", name="Fuzz GPU", index=0, total_memory_bytes=1 << 34),
        host=HostInfo(hostname="fuzz-host", cpu_model="cpu", physical_cores=8, logical_cores=16),
        capture=CaptureInfo(skip_steps=2, capture_steps=n_iterations, op_capture="native"),
        torch_version="2.13.0",
        ets_hook_version="0.1.0",
        step_times_s=[0.5, 0.25, 0.24, 0.26],
        rank=0,
        world_size=1,
        metadata={"model": "MLP", "batch_size": 32, "partial_steps": [1, 2], "nested": {"a": [1]}},
    )


def wrap(body: bytes, *, version: int = 1, flags: int = 0, length: int | None = None) -> bytes:
    """An ``.ets`` file around ``body`` with a correct checksum (and the given header fields)."""
    size = len(body) if length is None else length
    return HEADER.pack(trace_io.MAGIC, version, flags, size, zlib.crc32(body)) + body


def payload_of(data: bytes) -> Any:
    """The decoded payload of a valid ``.ets`` file (trusted: it is one of ours)."""
    return msgpack.unpackb(data[trace_io.HEADER_SIZE :], raw=False)


def field_paths(payload: Any) -> list[tuple[Any, ...]]:
    """Every node of a (trusted) payload as a path of map keys and list indices."""
    paths: list[tuple[Any, ...]] = []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(payload, ())]
    while stack:
        node, path = stack.pop()
        if path:
            paths.append(path)
        if isinstance(node, dict):
            stack.extend((value, (*path, key)) for key, value in node.items())
        elif isinstance(node, list):
            stack.extend((value, (*path, i)) for i, value in enumerate(node))
    return sorted(paths, key=repr)


def _nest(depth: int, leaf: Any, as_map: bool = False) -> Any:
    value = leaf
    for _ in range(depth):
        value = {"k": value} if as_map else [value]
    return value


#: Values put in place of a payload field: wrong types, extremes, non-finite numbers, nesting.
HOSTILE: list[tuple[str, Any]] = [
    ("inf", math.inf),
    ("-inf", -math.inf),
    ("nan", math.nan),
    ("float", 1.5),
    ("uint64 max", (1 << 64) - 1),
    ("int64 max+1", 1 << 63),
    ("int64 min", -(1 << 63)),
    ("int64 max", (1 << 63) - 1),
    ("int32 max+1", 1 << 31),
    ("-1", -1),
    ("-2", -2),
    ("0", 0),
    ("true", True),
    ("false", False),
    ("none", None),
    ("empty str", ""),
    ("str", "x"),
    ("escape str", "\x1b[2J\x1b]0;pwn\x07\n\r\u202e"),
    ("long str", "y" * 70_000),
    ("bytes", b"\xff" * 9),
    ("empty bytes", b""),
    ("empty list", []),
    ("list", [1, "a", None]),
    ("empty map", {}),
    ("map", {"a": 1}),
    ("int-key map", {1: 2}),
    ("bytes-key map", {b"k": 1}),
    ("list 400 deep", _nest(400, 1)),
    ("map 400 deep", _nest(400, 1, as_map=True)),
    ("list of 10^4", [0] * 10_000),
]

#: Raw msgpack spliced in place of a field: what ``packb`` cannot make.
RAW_HOSTILE: list[tuple[str, bytes]] = [
    ("array32 2^32-1", b"\xdd\xff\xff\xff\xff"),
    ("map32 2^32-1", b"\xdf\xff\xff\xff\xff"),
    ("str32 2^32-1", b"\xdb\xff\xff\xff\xff"),
    ("bin32 2^32-1", b"\xc6\xff\xff\xff\xff"),
    ("array16 bomb x200", b"\xdc\xff\xff" * 200),
    ("array32 5000 x1000 bomb", (b"\xdd" + (5000).to_bytes(4, "big")) * 1000),
    ("map16 bomb x200", b"\xde\xff\xff" * 200),
    ("fixarray 3000 deep", b"\x91" * 3000 + b"\xc0"),
    ("fixmap 2000 deep", b"\x81\xa1k" * 2000 + b"\xc0"),
    ("ext fixext1", b"\xd4\x01\x00"),
    ("ext timestamp32", b"\xd6\xff\x00\x00\x00\x01"),
    ("ext8 empty", b"\xc7\x00\x05"),
    ("0xc1", b"\xc1"),
    ("invalid utf-8", b"\xa2\xff\xfe"),
    ("surrogate utf-8", b"\xa3\xed\xa0\x80"),
    ("truncated float64", b"\xcb\x00"),
    ("nil run", b"\xc0" * 64),
    ("map int key", b"\x81\x01\x02"),
    ("map nil key", b"\x81\xc0\x02"),
    ("map list key", b"\x81\x90\x02"),
]


def _set(node: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A copy of ``node`` with ``path`` set to ``value`` (containers copied along the path)."""
    if not path:
        return value
    copy = dict(node) if isinstance(node, dict) else list(node)
    copy[path[0]] = _set(node[path[0]], path[1:], value)
    return copy


def _delete(node: Any, path: tuple[Any, ...]) -> Any:
    copy = dict(node) if isinstance(node, dict) else list(node)
    if len(path) == 1:
        del copy[path[0]]
    else:
        copy[path[0]] = _delete(node[path[0]], path[1:])
    return copy


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        node = node[key]
    return node


def _pack(payload: Any) -> bytes:
    return msgpack.packb(payload, use_bin_type=True)


def mutate_fields(
    rng: random.Random, payload: Any, paths: list[tuple[Any, ...]]
) -> tuple[str, Any]:
    """1-3 structured mutations of a payload: replace, delete, extend. Returns (kind, payload)."""
    kinds = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        path = rng.choice(paths)
        action = rng.random()
        try:
            if action < 0.75:
                name, value = rng.choice(HOSTILE)
                payload = _set(payload, path, value)
                kinds.append(f"replace:{name}")
            elif action < 0.85:
                payload = _delete(payload, path)
                kinds.append("delete")
            else:
                target = _get(payload, path)
                name, value = rng.choice(HOSTILE)
                if isinstance(target, list):
                    payload = _set(payload, path, [*target, value])
                elif isinstance(target, dict):
                    payload = _set(payload, path, {**target, "fuzz": value})
                else:
                    payload = _set(payload, path, [target, value])
                kinds.append(f"extend:{name}")
        except (KeyError, IndexError, TypeError):
            kinds.append("skip")  # an earlier mutation removed the path
    return "fields:" + "+".join(kinds[:1]), payload


def splice_raw(rng: random.Random, payload: Any, paths: list[tuple[Any, ...]]) -> tuple[str, bytes]:
    """The payload encoded with one field's msgpack replaced by raw hostile bytes."""
    name, raw = rng.choice(RAW_HOSTILE)
    marker = b"\x00ETSFUZZ" + rng.randbytes(8)
    body = _pack(_set(payload, rng.choice(paths), marker))
    return f"raw:{name}", body.replace(b"\xc4\x10" + marker, raw, 1)


_EXTREMES = (-1, -2, 0, 1, 2**31 - 1, -(2**31), 2**32 - 1, 2**63 - 1, -(2**63), 255, 3, 4)


def mutate_column(rng: random.Random, payload: Any) -> tuple[str, Any]:
    """One ops/kernels column blob: random bytes, an extreme element, or a wrong length."""
    index = rng.randrange(len(payload["iterations"]))
    side = rng.choice(("ops", "kernels"))
    spec = trace_io._OP_COLUMNS if side == "ops" else trace_io._KERNEL_COLUMNS
    column = rng.choice(list(spec))
    blob = payload["iterations"][index][side][column]
    path = ("iterations", index, side, column)
    action = rng.random()
    if action < 0.5 and blob:
        values = np.frombuffer(blob, dtype=spec[column]).copy()
        extreme = rng.choice(_EXTREMES)
        info = np.iinfo(values.dtype)
        values[rng.randrange(values.size)] = min(max(extreme, info.min), info.max)
        return f"column:extreme:{column}", _set(payload, path, values.tobytes())
    if action < 0.75:
        return f"column:random:{column}", _set(payload, path, rng.randbytes(len(blob)))
    size = max(0, len(blob) + rng.choice((-9, -8, -1, 1, 8, 4096)))
    return f"column:length:{column}", _set(payload, path, rng.randbytes(size))


def _flip_bits(rng: random.Random, data: bytes, start: int, flips: int) -> bytes:
    out = bytearray(data)
    for _ in range(flips):
        at = rng.randrange(start, len(out))
        out[at] ^= 1 << rng.randrange(8)
    return bytes(out)


def _edit_bytes(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(out) + 1)
        action = rng.random()
        if action < 0.4 and out:
            out[min(at, len(out) - 1)] = rng.randrange(256)
        elif action < 0.7:
            out[at:at] = rng.randbytes(rng.randint(1, 8))
        else:
            del out[at : at + rng.randint(1, 8)]
    return bytes(out)


class EtsInputs:
    """Generator of hostile ``.ets`` contents around a few valid seed files."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.small = trace_io.dumps(seed_trace())
        self.medium = trace_io.dumps(seed_trace(n_ops=300, n_iterations=3))
        self.large = trace_io.dumps(seed_trace(n_ops=2900, n_iterations=2))  # 0.97 MB
        self.seeds = []
        for data in (self.small, self.medium, self.large):
            payload = payload_of(data)
            self.seeds.append((data, payload, field_paths(payload)))

    def __call__(self) -> tuple[str, bytes]:
        rng = self.rng
        pick = rng.random()
        seed = 2 if pick < 0.002 else 1 if pick < 0.05 else 0
        data, payload, paths = self.seeds[seed]
        if seed == 1:
            paths = [p for p in paths if p[0] != "iterations" or len(p) <= 4]
        body = data[trace_io.HEADER_SIZE :]
        roll = rng.random()
        if roll < 0.04:
            return "random bytes", rng.randbytes(rng.choice((0, 1, 8, 23, 24, 25, 64, 300)))
        if roll < 0.10:
            return "random payload", wrap(rng.randbytes(rng.randint(0, 400)))
        if roll < 0.14:
            return "truncated", data[: rng.randrange(len(data))]
        if roll < 0.18:
            return "bit flips", _flip_bits(rng, data, 0, rng.randint(1, 8))
        if roll < 0.30:
            flipped = _flip_bits(rng, body, 0, rng.randint(1, 8))
            return "payload bit flips + crc", wrap(flipped)
        if roll < 0.38:
            return "payload byte edits + crc", wrap(_edit_bytes(rng, body))
        if roll < 0.70:
            kind, mutated = mutate_fields(rng, payload, paths)
            return kind, wrap(_pack(mutated))
        if roll < 0.82:
            kind, raw_body = splice_raw(rng, payload, paths)
            return kind, wrap(raw_body)
        if roll < 0.94:
            kind, mutated = mutate_column(rng, payload)
            return kind, wrap(_pack(mutated))
        field = rng.choice(("version", "flags", "length", "magic"))
        if field == "version":
            return "header:version", wrap(body, version=rng.choice((0, 2, 65535)))
        if field == "flags":
            return "header:flags", wrap(body, flags=rng.choice((1, 0x8000, 65535)))
        if field == "length":
            delta = rng.choice((-1, 1, len(body), 2**63, 2**64 - 1 - len(body)))
            return "header:length", wrap(body, length=max(0, min(2**64 - 1, len(body) + delta)))
        return "header:magic", b"ETSTRACF" + data[8:]


# ---------------------------------------------------------------------------------------------
# CSV and opCodes.dict inputs


def seed_csv_rows(n_rows: int = 12) -> list[list[str]]:
    """Header plus ``n_rows`` valid artifact rows, as lists of cell strings."""
    rows = [list(importers.ETS_CSV_COLUMNS)]
    t = 0
    for k in range(n_rows):
        direction = 1 + 3 * k // n_rows
        values = dict.fromkeys(importers.ETS_CSV_COLUMNS, "0")
        values.update(
            op=str(203 if k % 2 else 152),
            dir=str(direction),
            params=str([2, 3, 8, 8, 4, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 4] + [0] * 13),
            flops="100000.0",
            bytes="4e5",
            rStartTime=str(t),
            rEndTime=str(t + 100),
            kStartTime=str(t + 50),
            kEndTime=str(t + 450),
            space=str(200 - 30 * (k % 3)),
            seq=str(k),
            kernels="1",
            kduration="400",
            batch="2",
            h="16",
            w="16",
            input_type="1" if k % 5 else "2",
        )
        rows.append([values[c] for c in importers.ETS_CSV_COLUMNS])
        t += 700
    return rows


def _csv_text(rows: list[list[str]], newline: str = "\r\n") -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator=newline).writerows(rows)
    return out.getvalue()


HOSTILE_CELLS = [
    "",
    " ",
    "nan",
    "inf",
    "-inf",
    "1e400",
    "-1e400",
    "1e300",
    "9" * 5000,
    "-" + "9" * 5000,
    "9223372036854775808",
    "-9223372036854775809",
    "9223372036854775807",
    "4611686018427387905",
    "1e18",
    "0x10",
    "1_000",
    " 7 ",
    "\u0661\u0662",
    "\x00",
    '"',
    'a"b',
    "[1, 2]",
    "[" + ",".join(["9" * 30] * 30) + "]",
    "[" + ",".join(["-1"] * 30) + "]",
    "[" + "," * 60_000 + "]",
    "[" + ",".join(["1"] * 29) + ",x]",
    "x" * 140_000,
    "a\nb",
    "a\rb",
    "True",
    "-0",
    "+5",
    "1.5",
    "4.5e3",
    "\ud800",
    "\u202e\x1b[31m",
    "0",
    "-1",
    "4",
    "3",
    "2",
]


class CsvInputs:
    """Generator of hostile artifact CSV file contents."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.rows = seed_csv_rows()
        self.large = _csv_text(seed_csv_rows(5500)).encode()  # 0.98 MB

    def __call__(self) -> tuple[str, bytes]:
        rng = self.rng
        rows = [list(r) for r in self.rows]
        roll = rng.random()
        newline = rng.choice(("\r\n", "\n", "\n", "\r"))
        if roll < 0.001:
            return "large valid", self.large
        if roll < 0.45:
            kinds = []
            for _ in range(rng.choice((1, 1, 2, 3))):
                line = 0 if rng.random() < 0.05 else rng.randrange(1, len(rows))
                column = rng.randrange(len(rows[line]))
                cell = rng.choice(HOSTILE_CELLS)
                rows[line][column] = cell
                kinds.append(f"cell:{importers.ETS_CSV_COLUMNS[column]}")
            text = _csv_text(rows, newline) if rng.random() < 0.8 else _raw_join(rows, newline)
            return kinds[0], text.encode("utf-8", "surrogatepass")
        if roll < 0.60:
            line = rng.randrange(len(rows))
            action = rng.choice(("drop cell", "add cell", "drop line", "dup line", "blank", "swap"))
            if action == "drop cell" and rows[line]:
                del rows[line][rng.randrange(len(rows[line]))]
            elif action == "add cell":
                rows[line].insert(rng.randrange(len(rows[line]) + 1), rng.choice(HOSTILE_CELLS))
            elif action == "drop line":
                del rows[line]
            elif action == "dup line":
                rows.insert(line, list(rows[line]))
            elif action == "blank":
                rows.insert(line, [])
            else:
                other = rng.randrange(len(rows))
                rows[line], rows[other] = rows[other], rows[line]
            return f"shape:{action}", _csv_text(rows, newline).encode("utf-8", "surrogatepass")
        text = _csv_text(rows, newline)
        data = text.encode()
        if roll < 0.75:
            return "byte edits", _edit_bytes(rng, data)
        if roll < 0.82:
            return "truncated", data[: rng.randrange(len(data))]
        if roll < 0.87:
            encoding = rng.choice(("utf-16", "utf-8-sig", "latin-1", "cp1252"))
            mixed = text.replace("conv", "cönv\u00e9")
            return f"encoding:{encoding}", mixed.encode(encoding, "replace")
        if roll < 0.92:
            header = rows[0]
            action = rng.choice(("rename", "drop", "dup", "empty", "only"))
            if action == "rename":
                header[rng.randrange(len(header))] = rng.choice(HOSTILE_CELLS)[:50]
            elif action == "drop":
                del header[rng.randrange(len(header))]
            elif action == "dup":
                header.append(rng.choice(header))
            elif action == "empty":
                rows[0] = []
            else:
                rows = rows[:1]
            return f"header:{action}", _csv_text(rows, newline).encode("utf-8", "surrogatepass")
        if roll < 0.96:
            return "random bytes", rng.randbytes(rng.randint(0, 600))
        wide = rng.choice(("commas", "quotes", "lines", "nul"))
        if wide == "commas":
            return "wide:commas", data + b"," * 200_000 + b"\n"
        if wide == "quotes":
            return "wide:open quote", data + b'"' + b"x" * 150_000
        if wide == "lines":
            return "wide:blank lines", data + b"\n" * 200_000
        return "wide:nul", data.replace(b",", b"\x00,", 50)


def _raw_join(rows: list[list[str]], newline: str) -> str:
    """Rows joined without CSV quoting (so hostile cells can break the structure)."""
    return newline.join(",".join(r) for r in rows) + newline


OP_CODES_SEED = {"conv2d": 203, "relu": 152, "add_": 12, "mul_": 16, "linear": 7, "__add__": 21}

HOSTILE_OPCODES = [
    "{[1]: 2}",
    "{(1, [2]): 3}",
    "{'a': True}",
    "{'a': None}",
    "{'a': 1.5}",
    "{'a': 1e999}",
    "{'a': 1j}",
    "{1: 2}",
    "{b'a': 1}",
    "{f'a': 1}",
    "{'\\ud800': 1}",
    "{'a': " + "9" * 5000 + "}",
    "{'a': 99999999999999999999}",
    "{'a': -(-1)}",
    "{'a': " + "-" * 100_000 + "1}",
    "(" * 300 + ")" * 300,
    "[" * 100_000,
    "{'a': 1, **x}",
    "dict(a=1)",
    "[1, 2]",
    "{}",
    "",
    "\x00",
    "{'a': 1,}",
    "{'a' 'b': 0x10, 'c': 0o7, 'd': 1_0, 'e': -3}",
    "'''",
    "{'a':\n 1 # c\n}",
    "  {'a': 1}",
    "{'a': 1} {'b': 2}",
    "{'a': 1}}",
    "{'x' * 10**9: 1}",
    "{'a': __import__('os')}",
    "{'a': +-+-1}",
    "{'a': 1 if 1 else 2}",
]


class OpCodesInputs:
    """Generator of hostile ``opCodes.dict`` contents."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.seed = repr(OP_CODES_SEED)

    def __call__(self) -> tuple[str, bytes]:
        rng = self.rng
        roll = rng.random()
        if roll < 0.3:
            index = rng.randrange(len(HOSTILE_OPCODES))
            return f"literal:{index}", HOSTILE_OPCODES[index].encode("utf-8", "surrogatepass")
        if roll < 0.55:
            key = rng.choice(list(OP_CODES_SEED))
            value = rng.choice([*HOSTILE_CELLS, "True", "None", "[1]", "{}", "'x'", "-(-1)"])
            text = self.seed.replace(f"'{key}': {OP_CODES_SEED[key]}", f"'{key}': {value}")
            if rng.random() < 0.3:
                text = text.replace(f"'{key}'", rng.choice(("[1]", "1", "b'x'", "None", "(1,)")))
            return "entry", text.encode("utf-8", "surrogatepass")
        data = self.seed.encode()
        if roll < 0.80:
            return "byte edits", _edit_bytes(rng, data)
        if roll < 0.90:
            return "truncated", data[: rng.randrange(len(data))]
        return "random bytes", rng.randbytes(rng.randint(0, 300))


# ---------------------------------------------------------------------------------------------
# The loaders (current, or as committed at a git revision)


@dataclasses.dataclass
class Loaders:
    """The functions under test: the loaders and what ``ets-hook info`` does with a trace."""

    loads: Callable[..., Trace]
    read_ets_csv: Callable[..., Trace]
    load_op_codes: Callable[..., dict[int, str]]
    dumps: Callable[[Trace], bytes]
    format_info: Callable[[Trace, str], str]
    info_json: Callable[[Trace, str], str]


def current_loaders() -> Loaders:
    return Loaders(
        loads=trace_io.loads,
        read_ets_csv=importers.read_ets_csv,
        load_op_codes=importers.load_op_codes,
        dumps=trace_io.dumps,
        format_info=summary.format_info,
        info_json=lambda t, s: json.dumps(summary.info_document(t, s), allow_nan=False),
    )


def baseline_loaders(rev: str, folder: Path) -> Loaders:
    """The loaders as committed at ``rev``: ``trace/io.py``, ``importers.py`` and ``summary.py``
    copied from git with their relative imports pointed at the installed package."""

    def module(name: str) -> ModuleType:
        text = subprocess.run(
            ["git", "show", f"{rev}:ets_hook/trace/{name}.py"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        text = re.sub(r"^from \.\.(\w+)", r"from ets_hook.\1", text, flags=re.M)
        text = re.sub(r"^from \.(\w+)", r"from ets_hook.trace.\1", text, flags=re.M)
        path = folder / f"baseline_{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(f"baseline_{name}", path)
        assert spec is not None and spec.loader is not None
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = loaded
        spec.loader.exec_module(loaded)
        return loaded

    base_io, base_importers, base_summary = module("io"), module("importers"), module("summary")

    def info_json(trace: Trace, source: str) -> str:  # what _cmd_info --json printed at rev
        return json.dumps(
            {
                "trace": source,
                "device": dataclasses.asdict(trace.device),
                "capture": dataclasses.asdict(trace.capture),
                "torch_version": trace.torch_version,
                "step_times_s": trace.step_times_s,
                "iterations": [
                    dataclasses.asdict(base_summary.summarize_iteration(it))
                    for it in trace.iterations
                ],
            }
        )

    return Loaders(
        loads=base_io.loads,
        read_ets_csv=base_importers.read_ets_csv,
        load_op_codes=base_importers.load_op_codes,
        dumps=base_io.dumps,
        format_info=base_summary.format_info,
        info_json=info_json,
    )


# ---------------------------------------------------------------------------------------------
# Running


@dataclasses.dataclass
class Stats:
    """What one loader did with its inputs."""

    inputs: int = 0
    loaded: int = 0
    rejected: Counter[str] = dataclasses.field(default_factory=Counter)
    escaped: Counter[str] = dataclasses.field(default_factory=Counter)
    examples: dict[str, str] = dataclasses.field(default_factory=dict)
    kinds: Counter[str] = dataclasses.field(default_factory=Counter)
    peak_bytes: int = 0
    peak_kind: str = ""
    peak_input_bytes: int = 0
    max_wall_s: float = 0.0
    max_wall_kind: str = ""
    largest_input: int = 0
    seconds: float = 0.0

    def report(self) -> dict[str, Any]:
        return {
            "inputs": self.inputs,
            "loaded": self.loaded,
            "rejected": dict(self.rejected.most_common()),
            "escaped": dict(self.escaped.most_common()),
            "escaped_examples": self.examples,
            "peak_tracemalloc_bytes_inputs_le_1MB": self.peak_bytes,
            "peak_kind": self.peak_kind,
            "peak_input_bytes": self.peak_input_bytes,
            "max_wall_s": round(self.max_wall_s, 6),
            "max_wall_kind": self.max_wall_kind,
            "largest_input_bytes": self.largest_input,
            "total_s": round(self.seconds, 1),
            "input_kinds": len(self.kinds),
        }


def _attempt(run: Callable[[], None], stats: Stats, kind: str) -> None:
    try:
        run()
    except TraceFileError as exc:
        stats.rejected[type(exc).__name__] += 1
    except ETSCSVError as exc:  # before ETSCSVError became a TraceFileError
        stats.rejected[type(exc).__name__] += 1
    except _Escaped as exc:
        name = f"{exc.stage}:{type(exc.error).__name__}"
        stats.escaped[name] += 1
        stats.examples.setdefault(name, f"[{kind}] {str(exc.error)[:160]}")
    except Exception as exc:
        name = f"load:{type(exc).__name__}"
        stats.escaped[name] += 1
        stats.examples.setdefault(name, f"[{kind}] {str(exc)[:160]}")
    else:
        stats.loaded += 1


class _Escaped(Exception):
    """An exception from checking a loaded trace (printing or saving it)."""

    def __init__(self, stage: str, error: BaseException) -> None:
        super().__init__(stage)
        self.stage, self.error = stage, error


def _runner(loader: str, loaders: Loaders, data: bytes, path: Path) -> Callable[[], None]:
    def ets() -> None:
        trace = loaders.loads(data, source="fuzz.ets")
        _checked(loaders, trace)

    def csv_file() -> None:
        trace = loaders.read_ets_csv(path, op_codes={}, device_name=None)
        _checked(loaders, trace)

    def op_codes() -> None:
        table = loaders.load_op_codes(path)
        if not all(type(k) is int and type(v) is str for k, v in table.items()):
            raise _Escaped("check", TypeError("op code table of other types"))

    return {"ets": ets, "csv": csv_file, "opcodes": op_codes}[loader]


def _checked(loaders: Loaders, trace: Trace) -> None:
    """What ``ets-hook info`` does with a loaded trace (text and JSON), then saving it again."""
    for stage, step in (
        ("info", lambda: loaders.format_info(trace, "fuzz")),
        ("info-json", lambda: loaders.info_json(trace, "fuzz")),
        ("save", lambda: loaders.dumps(trace)),
    ):
        try:
            step()
        except Exception as exc:
            raise _Escaped(stage, exc) from exc


def generators(rng: random.Random) -> dict[str, Callable[[], tuple[str, bytes]]]:
    return {"ets": EtsInputs(rng), "csv": CsvInputs(rng), "opcodes": OpCodesInputs(rng)}


def fuzz(
    loader: str, loaders: Loaders, count: int, seed: int, folder: Path, *, trace_memory: bool
) -> Stats:
    """Run ``count`` inputs through one loader; every other one under tracemalloc."""
    rng = random.Random(f"{seed}:{loader}")
    make = generators(rng)[loader]
    path = folder / ("fuzz.1_7.csv" if loader == "csv" else "opCodes.dict")
    stats = Stats()
    started = time.perf_counter()
    for index in range(count):
        kind, data = make()
        stats.inputs += 1
        stats.kinds[kind] += 1
        stats.largest_input = max(stats.largest_input, len(data))
        if loader != "ets":
            path.write_bytes(data)
        run = _runner(loader, loaders, data, path)
        traced = trace_memory and index % 2 == 0 and len(data) <= PEAK_INPUT_LIMIT
        if traced:
            tracemalloc.start()
            _attempt(run, stats, kind)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            if peak > stats.peak_bytes:
                stats.peak_bytes, stats.peak_kind, stats.peak_input_bytes = peak, kind, len(data)
        else:
            t0 = time.perf_counter()
            _attempt(run, stats, kind)
            wall = time.perf_counter() - t0
            if wall > stats.max_wall_s:
                stats.max_wall_s, stats.max_wall_kind = wall, kind
    stats.seconds = time.perf_counter() - started
    return stats


def _print(name: str, stats: Stats) -> None:
    report = stats.report()
    print(f"== {name}: {report['inputs']} inputs in {report['total_s']} s")
    print(f"   loaded {report['loaded']}")
    for cls, n in report["rejected"].items():
        print(f"   rejected {cls}: {n}")
    print(f"   escaped classes: {len(report['escaped'])}")
    for cls, n in report["escaped"].items():
        print(f"   ESCAPED {cls}: {n}   e.g. {report['escaped_examples'][cls]}")
    print(
        f"   peak tracemalloc (inputs <= 1 MB): {report['peak_tracemalloc_bytes_inputs_le_1MB']}"
        f" bytes ({report['peak_kind']}, input of {report['peak_input_bytes']} bytes)"
    )
    print(f"   max wall per input: {report['max_wall_s']:.4f} s ({report['max_wall_kind']})")


def iter_loaders(text: str) -> Iterator[str]:
    for name in text.split(","):
        if name not in LOADERS:
            raise SystemExit(f"unknown loader {name!r}: choose from {', '.join(LOADERS)}")
        yield name


def main(argv: list[str] | None = None) -> int:
    """Run the fuzzer; the exit status is 1 when any input escaped the current loaders."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=100_000, help="inputs per loader")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loaders", default=",".join(LOADERS))
    parser.add_argument(
        "--against",
        choices=("current", "baseline", "both"),
        default="current",
        help="the loaders of the working tree, those committed at --rev, or both",
    )
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--no-tracemalloc", action="store_true")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    names = list(iter_loaders(args.loaders))
    # Quiet for the run only (a test calls main() in-process): the importers warn on FP16
    # rows, literal_eval on hostile literals.
    disabled_before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _run(args, names)
    finally:
        logging.disable(disabled_before)


def _run(args: argparse.Namespace, names: list[str]) -> int:
    """``main``'s fuzzing and report, once its arguments are parsed."""
    report: dict[str, Any] = {"inputs_per_loader": args.inputs, "seed": args.seed}
    escaped = 0
    with tempfile.TemporaryDirectory(prefix="ets-fuzz-") as tmp:
        folder = Path(tmp)
        runs = []
        if args.against in ("baseline", "both"):
            runs.append((f"before ({args.rev})", baseline_loaders(args.rev, folder)))
        if args.against in ("current", "both"):
            runs.append(("after", current_loaders()))
        for label, loaders in runs:
            for name in names:
                stats = fuzz(
                    name,
                    loaders,
                    args.inputs,
                    args.seed,
                    folder,
                    trace_memory=not args.no_tracemalloc,
                )
                _print(f"{label} {name}", stats)
                report.setdefault(label, {})[name] = stats.report()
                if label == "after":
                    escaped += sum(stats.escaped.values())
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if escaped else 0


if __name__ == "__main__":
    sys.exit(main())
