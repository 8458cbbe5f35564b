"""What the launcher told this process: its rank, the job's size, the restart count.

Read from the environment that ``torchrun`` (``RANK``, ``WORLD_SIZE``,
``TORCHELASTIC_RESTART_COUNT``), Slurm's ``srun`` (``SLURM_PROCID``, ``SLURM_NTASKS``), Open MPI
(``OMPI_COMM_WORLD_RANK``/``_SIZE``) and MPICH/Intel MPI (``PMI_RANK``/``PMI_SIZE``) set, in that
order of precedence. Used before ``torch.distributed`` is initialised (and by the reporters,
which do not import torch). Imports nothing from the package.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: (rank variable, world-size variable) of each launcher, in order of precedence.
LAUNCHER_VARIABLES = (
    ("RANK", "WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
)


def _int_or_none(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text.strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def launcher_rank_and_size(environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """This process's ``(rank, world size)`` from the launcher's environment variables.

    Args:
        environ: the environment; None: ``os.environ``.

    Returns:
        The first launcher's pair (see ``LAUNCHER_VARIABLES``) whose rank is a valid int
        (a missing or invalid size counts as ``rank + 1``, and a size <= rank is raised to
        ``rank + 1``); ``(0, 1)`` when no launcher set one. Never raises.
    """
    env = os.environ if environ is None else environ
    for rank_name, size_name in LAUNCHER_VARIABLES:
        rank = _int_or_none(env.get(rank_name))
        if rank is None:
            continue
        size = _int_or_none(env.get(size_name)) or 0
        return rank, max(size, rank + 1)
    return 0, 1


def restart_count(environ: Mapping[str, str] | None = None) -> int:
    """How many times ``torchrun`` restarted the job's workers (``TORCHELASTIC_RESTART_COUNT``);
    0 when unset or invalid. Never raises."""
    env = os.environ if environ is None else environ
    return _int_or_none(env.get("TORCHELASTIC_RESTART_COUNT")) or 0


def fill_rank(path: str | os.PathLike[str], rank: int) -> str:
    """``path`` as a string with ``{rank}`` replaced by ``rank`` (nothing else is formatted)."""
    return os.fspath(path).replace("{rank}", str(rank))


def rank_suffixed(path: str | os.PathLike[str], rank: int) -> Path:
    """One rank's file beside ``path``: ``run.ets`` -> ``run.rank1.ets`` (traces, status files).

    Args:
        path: the path the user gave.
        rank: the rank.

    Returns:
        ``path`` with ``.rank<rank>`` before its suffix.
    """
    target = Path(path)
    return target.with_name(f"{target.stem}.rank{rank}{target.suffix}")
