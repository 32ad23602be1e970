"""What a process that should be leaving is doing: every thread's stack as text, and a
deadline after which a stopping process says so and leaves anyway.

A long-running process (a coordinator, an agent on a device) stops on SIGTERM or Ctrl-C by
ending its servers and threads in order. Should one of them not end, the process would
hang where its supervisor (systemd, Docker, Kubernetes, a test) waits for it, with nothing
said. :func:`exit_deadline` bounds that wait and tells where it hung.
"""

from __future__ import annotations

import os
import sys
import threading
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
