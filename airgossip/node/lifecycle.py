"""An agent process's life: it never outlives its launcher, a stuck shutdown still ends,
its log lines and torch threads are set once."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time

import torch

from airgossip.common.stacks import exit_deadline

#: Longest graceful shutdown (leave, drain sends, close servers) before the process exits anyway.
SHUTDOWN_GRACE_S = 8.0


def exit_after(seconds: float, why: str) -> None:
    """Exit the process in ``seconds`` whatever the main thread is doing, saying where it
    hung (:func:`~airgossip.common.stacks.exit_deadline`): a shutdown stuck on a dying
    peer or coordinator must not leave the agent behind."""
    exit_deadline(why, 0, seconds)


def die_with_parent(parent_pid: int) -> None:
    """Make sure this process never outlives its parent (the launcher): the kernel sends
    SIGTERM when the parent dies (Linux), and a watchdog thread exits the process if the
    parent is gone while the main thread cannot run the signal handler. Exit at once if
    the parent is already gone."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent_pid:
        raise SystemExit("parent process is gone; not starting")

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        exit_after(SHUTDOWN_GRACE_S, "parent process gone")

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def configure_process(threads: int | None) -> None:
    """Log lines with time, level and source; ``threads`` torch CPU threads (None: torch's
    own choice)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if threads:
        torch.set_num_threads(threads)
