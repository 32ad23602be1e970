"""The kernel's tools: whether network namespaces, tc and iptables work here, and running them."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

log = logging.getLogger("airgossip.kernel")
#: The tools the applier runs.
TOOLS = ("ip", "tc", "iptables", "iptables-save", "iptables-restore")


class KernelUnavailable(RuntimeError):
    """This machine cannot run the kernel backend (not root, no ip/tc/iptables...)."""


@dataclass(frozen=True)
class KernelSupport:
    """What the kernel offers here: the backend at all (else why not), and netem."""

    available: bool
    reason: str = ""
    netem: bool = False


def run_command(command: Sequence[str], *, stdin: str | None = None, check: bool = True) -> str:
    """Run one tool; its output, or :class:`KernelUnavailable` with its error line."""
    result = subprocess.run(list(command), input=stdin, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise KernelUnavailable(f"{' '.join(command)} failed: {result.stderr.strip()}")
    return result.stdout


def missing_tool() -> str | None:
    """Why a tool the applier runs is missing (None: none is)."""
    for tool in TOOLS:
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (apt-get install iproute2 iptables)"
    return None


def kernel_support() -> KernelSupport:
    """Whether namespaces, tc and iptables work here, and whether netem exists."""
    if os.geteuid() != 0:
        return KernelSupport(False, "the kernel backend needs root (network namespaces)")
    missing = missing_tool()
    if missing is not None:
        return KernelSupport(False, missing)
    probe = f"agprobe{os.getpid()}"
    try:
        run_command(["ip", "netns", "add", probe])
    except KernelUnavailable as err:
        return KernelSupport(False, f"network namespaces are unavailable: {err}")
    try:
        run_command(["ip", "-n", probe, "link", "set", "lo", "up"])
        inside = ["ip", "netns", "exec", probe]
        netem_probe = [*inside, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]
        netem = subprocess.run(netem_probe, capture_output=True, timeout=10).returncode == 0
        try:
            run_command([*inside, "iptables", "-A", "INPUT", "-m", "statistic", "--mode",
                         "random", "--probability", "0.5", "-j", "DROP"])  # fmt: skip
        except KernelUnavailable as err:
            return KernelSupport(False, f"iptables statistic drops are unavailable: {err}")
        return KernelSupport(True, "", netem)
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10)


def netem_available(prefix: Sequence[str] = ()) -> bool:
    """Whether this kernel has the netem qdisc (probed on ``lo``, then removed)."""
    add = [*prefix, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]
    if subprocess.run(add, capture_output=True, timeout=10).returncode != 0:
        return False
    subprocess.run([*prefix, "tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True,
                   timeout=10)  # fmt: skip
    return True
