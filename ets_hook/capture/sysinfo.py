"""Host and device facts recorded with every trace (psutil, pynvml by UUID, torch).

Contract: every function here returns a value and never raises; a fact that cannot be read is left
at its empty default. NVML ignores CUDA_VISIBLE_DEVICES, so the NVML handle of a torch device is
found by the device's UUID, never by its index.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
from typing import Any

from ..trace.events import DeviceInfo, HostInfo


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
