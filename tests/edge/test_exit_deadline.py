"""A stopping process that something holds leaves by its deadline and says where it hung."""

from __future__ import annotations

import subprocess
import sys
import textwrap

HELD = textwrap.dedent(
    """
    import threading
    from airgossip.common.stacks import exit_deadline

    def hold_forever():
        threading.Event().wait()

    threading.Thread(target=hold_forever, name="stuck-handler").start()  # not a daemon
    exit_deadline("tester", 7, seconds=0.5)
    """
)


def test_a_process_held_on_its_way_out_leaves_with_its_code_and_the_stuck_stack() -> None:
    done = subprocess.run([sys.executable, "-c", HELD], capture_output=True, text=True, timeout=60)
    assert done.returncode == 7, done.stderr
    assert "tester: still stopping after 0.5 s; leaving anyway" in done.stderr
    assert "thread stuck-handler" in done.stderr and "hold_forever" in done.stderr


def test_a_disarmed_deadline_lets_a_slow_exit_finish_as_it_would() -> None:
    script = HELD.replace("threading.Event().wait()", "threading.Event().wait(1.5)").replace(
        'exit_deadline("tester", 7, seconds=0.5)', 'exit_deadline("tester", 7, seconds=0.5).set()'
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "still stopping" not in done.stderr, done.stderr


def test_a_stop_flag_set_by_a_signal_ends_a_wait_and_takes_no_lock() -> None:
    """The flag a SIGTERM handler sets (a coordinator hung when its handler's Event.set waited
    for the lock of the Event.wait it interrupted): a wait ends once it is set, else at its
    timeout."""
    import signal
    import threading
    import time

    from airgossip.common.stacks import StopFlag

    flag = StopFlag()
    assert not flag.wait(0.05) and not flag.is_set()
    previous = signal.signal(signal.SIGUSR1, lambda *_: flag.set())
    try:
        main = threading.main_thread().ident
        assert main is not None
        timer = threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGUSR1))
        began = time.monotonic()
        timer.start()
        assert flag.wait(30.0)
        assert time.monotonic() - began < 5.0 and flag.is_set()
    finally:
        signal.signal(signal.SIGUSR1, previous)
