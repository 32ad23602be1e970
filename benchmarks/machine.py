"""The machine a benchmark ran on: CPU, cores, memory, load, versions."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def describe() -> dict[str, Any]:
    """A plain description of this machine and the software under test."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "load_average_1m_at_start": round(load[0], 2),
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "torch": _version("torch"),
        "grpcio": _version("grpcio"),
        "flwr": _version("flwr"),
        "ray": _version("ray"),
        "numpy": _version("numpy"),
        "gpu": _gpu(),
    }


def _gpu() -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return "none (the CUDA check did not run)"


def markdown(machine: dict[str, Any]) -> str:
    return (
        f"{machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, "
        f"{machine['os']}; Python {machine['python']}, torch {machine['torch']}, "
        f"grpcio {machine['grpcio']}, flwr {machine['flwr']}, ray {machine['ray']}; "
        f"GPU: {machine['gpu']}; load average at start {machine['load_average_1m_at_start']}"
    )
