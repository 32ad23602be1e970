"""Stopping a process: a stop request a signal handler can make safely, what a process
that should be leaving is doing (every thread's stack as text), and a deadline after which
a stopping process says so and leaves anyway.

A long-running process (a coordinator, an agent on a device) stops on SIGTERM or Ctrl-C by
ending its servers and threads in order. Should one of them not end, the process would
hang where its supervisor (systemd, Docker, Kubernetes, a test) waits for it, with nothing
said. :func:`exit_deadline` bounds that wait and tells where it hung.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

#: Seconds a process that is stopping may take before :func:`exit_deadline` ends it.
EXIT_DEADLINE_S = 30.0


def thread_stacks() -> str:
    """Every live thread's name and stack, innermost call last."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        stack = "".join(traceback.format_stack(frame))
        parts.append(f"thread {names.get(ident, ident)}:\n{stack}")
    return "\n".join(parts)


def exit_deadline(who: str, code: int, seconds: float = EXIT_DEADLINE_S) -> threading.Event:
    """Arm a deadline for a process that is stopping: if it is still running ``seconds``
    later, one line on stderr says so, every thread's stack follows, and the process exits
    with ``code``. Set the returned event to disarm it."""
    done = threading.Event()

    def watch() -> None:
        if done.wait(seconds):
            return
        text = f"{who}: still stopping after {seconds:g} s; leaving anyway. Threads:\n"
        os.write(2, (text + thread_stacks()).encode(errors="replace"))
        os._exit(code)

    threading.Thread(target=watch, name="exit-deadline", daemon=True).start()
    return done


class StopFlag:
    """A stop request a signal handler can make: a plain flag, waited on by polling.

    A handler runs in the main thread between two bytecodes, possibly inside
    ``threading.Event.wait`` with the event's lock held: ``Event.set`` there waits for that
    lock forever (a coordinator stopped while it waited between two progress lines hung
    so). Setting this flag takes no lock; :meth:`wait` sleeps in short steps.
    """

    #: Seconds between two looks at the flag while waiting.
    POLL_S = 0.1

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        """Ask to stop (from a signal handler or any thread)."""
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Whether the flag was set within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self._set:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(left, self.POLL_S))
        return True
