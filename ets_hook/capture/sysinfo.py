"""Host and device facts recorded with every trace (psutil, pynvml by UUID, torch).

Contract: every function here returns a value and never raises; a fact that cannot be read is left
at its empty default. NVML ignores CUDA_VISIBLE_DEVICES, so the NVML handle of a torch device is
found by the device's UUID, never by its index.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..launcher import launcher_rank_and_size, rank_suffixed
from ..trace.atomic import check_writable_argument
from ..trace.events import DeviceInfo, HostInfo

logger = logging.getLogger("ets_hook")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def host_info() -> HostInfo:
    """Facts about this host: hostname, CPU model, core counts, memory, torch threads.

    Core counts and memory come from psutil; without it only ``logical_cores`` is filled
    (``os.cpu_count()``). Facts that cannot be read stay 0 / "".
    """
    info = HostInfo(hostname=socket.gethostname(), cpu_model=_cpu_model())
    try:
        import psutil

        info.physical_cores = psutil.cpu_count(logical=False) or 0
        info.logical_cores = psutil.cpu_count(logical=True) or 0
        info.memory_bytes = int(psutil.virtual_memory().total)
    except Exception:
        info.logical_cores = os.cpu_count() or 0
    try:
        import torch

        info.torch_threads = int(torch.get_num_threads())
    except Exception:
        pass
    return info


def usable_cpu_count() -> int:
    """CPUs this process may run on: its affinity mask (what ``taskset``, cgroups' cpusets
    and Slurm's binding leave it), else ``os.cpu_count()``; at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):  # not on Linux
        return max(os.cpu_count() or 1, 1)


def _nvml_facts(uuid: str) -> dict[str, Any]:
    """Driver version and memory of the GPU with this UUID; {} without NVML or a driver."""
    if not uuid:
        return {}
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound / DriverNotLoaded: no GPU facts to add
        return {}
    try:
        nvml_uuid = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        handle = pynvml.nvmlDeviceGetHandleByUUID(nvml_uuid)
        driver = pynvml.nvmlSystemGetDriverVersion()
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return {
            "driver_version": driver.decode() if isinstance(driver, bytes) else str(driver),
            "total_memory_bytes": int(memory.total),
        }
    except Exception:
        return {}
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def device_info(device: Any = None) -> DeviceInfo:
    """Facts about ``device``; never raises.

    For CUDA devices: torch's device properties, plus driver version and memory from NVML
    (looked up by UUID) when pynvml is installed. Other device types get only ``kind`` and
    ``name`` (the CPU model for "cpu").

    Args:
        device: a ``torch.device``, a device string, or None for the CPU. A CUDA device without
            an index means the current device.

    Returns:
        The facts; ``kind`` "cuda" with ``name`` "cuda" when CUDA is not available, and an empty
        ``DeviceInfo()`` (kind "cpu") when anything fails, e.g. an invalid device string.
    """
    try:
        import torch

        dev = torch.device(device) if device is not None else torch.device("cpu")
        if dev.type != "cuda" or not torch.cuda.is_available():
            return DeviceInfo(kind=dev.type, name=_cpu_model() if dev.type == "cpu" else dev.type)
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        info = DeviceInfo(
            kind="cuda",
            name=props.name,
            index=index,
            uuid=str(getattr(props, "uuid", "")),
            total_memory_bytes=int(props.total_memory),
            multiprocessor_count=int(props.multi_processor_count),
            compute_capability=f"{props.major}.{props.minor}",
        )
        for key, value in _nvml_facts(info.uuid).items():
            setattr(info, key, value)
        return info
    except Exception:
        return DeviceInfo()


def model_device(model: Any) -> Any:
    """The device of the model's first parameter or buffer; never raises.

    Returns:
        That tensor's ``torch.device``; the string "cpu" when the model has neither or
        cannot be iterated.
    """
    try:
        for tensor in model.parameters():
            return tensor.device
        for tensor in model.buffers():
            return tensor.device
    except Exception:
        pass
    return "cpu"


def training_state_bytes(model: Any, optimizers: Any = ()) -> int:
    """Bytes a checkpoint of the model and its optimizers' state writes: every parameter and
    buffer, and every tensor in the optimizers' ``state`` (Adam's two moments, SGD's momentum,
    ...; empty before the first optimizer step). Never raises.

    Args:
        model: a ``torch.nn.Module``.
        optimizers: torch optimizers (any iterable; none by default).

    Returns:
        The byte count; 0 where nothing could be read.
    """
    total = 0
    try:
        for tensor in (*model.parameters(), *model.buffers()):
            total += tensor.numel() * tensor.element_size()
        for optimizer in optimizers:
            for state in optimizer.state.values():
                for value in state.values():
                    if hasattr(value, "element_size") and hasattr(value, "numel"):
                        total += value.numel() * value.element_size()
    except Exception:
        return total
    return total


def machine_facts(device: Any) -> tuple[DeviceInfo | None, HostInfo | None]:
    """Device and host facts for the trace, gathered up front (never raises).

    Args:
        device: the training device.

    Returns:
        ``(device facts, host facts)``; None where gathering failed (the decode retries).
    """
    facts: list[Any] = []
    for gather in (lambda: device_info(device), host_info):
        try:
            facts.append(gather())
        except Exception as exc:
            logger.debug("machine facts unavailable now: %r", exc)
            facts.append(None)
    return facts[0], facts[1]


def distributed_rank() -> tuple[int, int]:
    """This process's ``(rank, world size)``: from ``torch.distributed`` when initialised, else
    the launcher's variables (``ets_hook.launcher``: torchrun, Slurm, MPI), else ``(0, 1)``.
    Never raises."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    return launcher_rank_and_size()


def rank_trace_path(path: str | os.PathLike[str], rank: int, world_size: int) -> Path:
    """The trace path of one rank: fill a ``{rank}`` placeholder, or add ``.rank<N>`` under DDP.

    Args:
        path: the path the user gave; ``{rank}`` in it is filled whatever the world size.
        rank: this process's rank.
        world_size: number of processes; above 1 (and without ``{rank}``), ``run.ets`` becomes
            ``run.rank<rank>.ets``.

    Returns:
        The path for this rank (``path`` unchanged for a single process without ``{rank}``).

    Raises:
        KeyError, IndexError, ValueError: ``path`` holds ``{rank}`` and other ``{...}`` fields or
            stray braces (it goes through ``str.format``).
    """
    text = os.fspath(path)
    if "{rank}" in text:
        return Path(text.format(rank=rank))
    if world_size > 1:
        return rank_suffixed(text, rank)
    return Path(text)


def checked_trace_path(
    trace_path: str | os.PathLike[str] | None, rank: int, world_size: int
) -> Path | None:
    """This rank's trace path (``rank_trace_path``), checked before training starts.

    Args:
        trace_path: the path the user gave, or None.
        rank: this process's rank.
        world_size: number of processes.

    Returns:
        The path for this rank; None when ``trace_path`` is None.

    Raises:
        ValueError: ``trace_path`` is not a path, holds ``{...}`` fields other than ``{rank}``,
            names a directory, or its directory does not exist or takes no new file (read-only,
            not this user's: the file is written once, after the window; a folder that cannot
            take it is said here, before training starts).
    """
    if trace_path is None:
        return None
    try:
        path = rank_trace_path(trace_path, rank, world_size)
    except (TypeError, KeyError, IndexError, ValueError) as exc:
        raise ValueError(
            f"trace_path must be a path whose only field is {{rank}}, got {trace_path!r} ({exc!r})"
        ) from exc
    if path.is_dir():
        raise ValueError(f"trace_path is a directory: {path}")
    if not path.parent.is_dir():
        raise ValueError(f"trace_path's directory does not exist: {path.parent}")
    check_writable_argument("trace_path", path)
    return path


#: Set to 1 (or true/yes/on) to turn every ETSHook into a no-op without a code change.
DISABLE_ENV = "ETS_HOOK_DISABLE"


def hooks_disabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``ETS_HOOK_DISABLE`` turns hooks off (``1``, ``true``, ``yes`` or ``on``).

    Args:
        environ: the environment to read; None: ``os.environ``.

    Returns:
        True when the switch is on.
    """
    value = (os.environ if environ is None else environ).get(DISABLE_ENV, "")
    return value.strip().lower() in ("1", "true", "yes", "on")
