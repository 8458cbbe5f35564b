"""Name interning (ets_hook._C.StringTable) and bulk resolution."""

from __future__ import annotations

import numpy as np
import pytest

from ets_hook import _C
from ets_hook.capture.cupti import StringTable, name_table, resolve_names


def test_round_trip_and_stable_ids() -> None:
    table = StringTable()
    names = ["volta_sgemm_128x64_nn", "void at::native::vectorized_elementwise_kernel<4>()", "x"]
    ids = [table.intern(n) for n in names]
    assert len(set(ids)) == 3
    assert [table.intern(n) for n in names] == ids  # same name, same id
    assert [table.resolve_many([i])[0] for i in ids] == names
    assert len(table) == 4  # the three names plus "" at id 0


def test_empty_name_is_id_zero() -> None:
    table = StringTable()
    assert table.intern("") == 0
    assert table.resolve_many([0])[0] == ""


def test_non_ascii_and_long_names_survive() -> None:
    table = StringTable()
    long_name = "_ZN" + "k" * 100_000  # longer than an arena block
    names = ["ядро_ξ_核", long_name, "tab\tand\nnewline"]
    ids = _C._testing.intern_many(table, names)
    assert ids.dtype == np.uint32
    assert table.resolve_many(ids) == names


def test_bulk_resolve_keeps_order_and_duplicates() -> None:
    table = StringTable()
    ids = _C._testing.intern_many(table, [f"kernel_{i}" for i in range(1000)])
    query = np.concatenate([ids[::-1], ids[:10], ids[:10]])
    expected = [f"kernel_{i}" for i in range(999, -1, -1)] + [f"kernel_{i}" for i in range(10)] * 2
    assert table.resolve_many(query) == expected
    assert resolve_names(query, table=table) == expected


def test_many_names_cross_chunk_boundaries() -> None:
    table = StringTable()
    n = 10_000  # > 2 chunks of 4096 entries
    ids = _C._testing.intern_many(table, [f"n{i}" for i in range(n)])
    np.testing.assert_array_equal(ids, np.arange(1, n + 1))
    assert table.resolve_many(ids[4090:4100]) == [f"n{i}" for i in range(4090, 4100)]


@pytest.mark.parametrize("bad", [-1, 5, 2**40])
def test_unknown_ids_are_value_errors(bad: int) -> None:
    table = StringTable()
    table.intern("a")
    with pytest.raises(ValueError, match=str(bad)):
        table.resolve_many([bad])[0]
    with pytest.raises(ValueError, match="unknown name id"):
        table.resolve_many([1, bad])


def test_process_table_is_shared_with_the_module_helpers() -> None:
    name_id = name_table().intern("ets_hook_test_kernel_name")
    assert _C.names() is not None
    assert name_table().resolve_many([name_id])[0] == "ets_hook_test_kernel_name"
    assert resolve_names([name_id, 0, name_id]) == [
        "ets_hook_test_kernel_name",
        "",
        "ets_hook_test_kernel_name",
    ]
    assert resolve_names([]) == []


def test_demangle_keeps_unmangled_names() -> None:
    out = _C.demangle(
        ["_ZN2at6native18elementwise_kernelILi128ELi2EEEvi", "ncclDevKernel_AllReduce"]
    )
    assert out == ["void at::native::elementwise_kernel<128, 2>(int)", "ncclDevKernel_AllReduce"]
