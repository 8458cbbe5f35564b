"""launcher: rank and world size from torchrun / Slurm / MPI variables, and the restart count."""

from __future__ import annotations

import pytest

from ets_hook.launcher import LAUNCHER_VARIABLES, launcher_rank_and_size, restart_count
from ets_hook.reporters.tensorboard import launcher_rank

#: Every launcher's variables set at once, each launcher with a different rank and size.
ALL_SET = {
    name: str(value)
    for i, (rank_name, size_name) in enumerate(LAUNCHER_VARIABLES)
    for name, value in ((rank_name, i + 1), (size_name, 10 * (i + 1)))
}


def test_no_launcher_means_a_single_process() -> None:
    assert launcher_rank_and_size({}) == (0, 1)
    assert launcher_rank_and_size({"LOCAL_RANK": "3", "UNRELATED": "1"}) == (0, 1)


@pytest.mark.parametrize("dropped", range(len(LAUNCHER_VARIABLES)))
def test_precedence_rank_then_slurm_then_ompi_then_pmi(dropped: int) -> None:
    # Without the first ``dropped`` launchers' variables, the next launcher's pair wins whole.
    env = {
        name: value
        for name, value in ALL_SET.items()
        if not any(name in pair for pair in LAUNCHER_VARIABLES[:dropped])
    }
    rank_name, size_name = LAUNCHER_VARIABLES[dropped]
    assert launcher_rank_and_size(env) == (int(env[rank_name]), int(env[size_name]))


def test_the_documented_order() -> None:
    assert [rank for rank, _ in LAUNCHER_VARIABLES] == [
        "RANK",
        "SLURM_PROCID",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
    ]


@pytest.mark.parametrize("bad", ["", "x", "-1", "1.5", "0x2", "nan"])
def test_an_invalid_rank_is_skipped_for_the_next_launcher(bad: str) -> None:
    env = {"RANK": bad, "WORLD_SIZE": "8", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"}
    assert launcher_rank_and_size(env) == (3, 4)
    env = {"RANK": bad, "WORLD_SIZE": "8", "PMI_RANK": bad, "PMI_SIZE": "2"}
    assert launcher_rank_and_size(env) == (0, 1)


@pytest.mark.parametrize(
    ("size", "rank"),
    [(None, 0), (None, 5), ("", 2), ("many", 2), ("-3", 2), ("0", 0), ("2", 3), ("3", 3)],
)
def test_a_missing_invalid_or_too_small_size_is_raised_to_rank_plus_one(
    size: str | None, rank: int
) -> None:
    env = {"RANK": str(rank)}
    if size is not None:
        env["WORLD_SIZE"] = size
    assert launcher_rank_and_size(env) == (rank, rank + 1)


def test_a_larger_size_is_kept_and_sizes_are_not_taken_from_another_launcher() -> None:
    assert launcher_rank_and_size({"RANK": "2", "WORLD_SIZE": "16"}) == (2, 16)
    # The pair is the first valid launcher's: Slurm's task count does not size torchrun's job.
    assert launcher_rank_and_size({"RANK": "1", "SLURM_NTASKS": "8"}) == (1, 2)


def test_os_environ_is_read_when_no_mapping_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    for rank_name, size_name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(rank_name, raising=False)
        monkeypatch.delenv(size_name, raising=False)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert launcher_rank_and_size() == (0, 1)
    assert restart_count() == 0
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    assert launcher_rank_and_size() == (2, 4)
    assert launcher_rank() == 2  # the reporters' fallback reads the same variables
    assert restart_count() == 3


@pytest.mark.parametrize(
    ("value", "expected"), [(None, 0), ("0", 0), ("2", 2), ("x", 0), ("-1", 0), ("", 0)]
)
def test_restart_count(value: str | None, expected: int) -> None:
    env = {} if value is None else {"TORCHELASTIC_RESTART_COUNT": value}
    assert restart_count(env) == expected


def test_reporters_fallback_rank_follows_the_launcher_order() -> None:
    assert launcher_rank({"SLURM_PROCID": "5", "PMI_RANK": "1"}) == 5
    assert launcher_rank({"RANK": "bad", "PMI_RANK": "1"}) == 1
    assert launcher_rank({}) == 0
