"""An interrupted lab run asks Python to keep ignoring the rest of the user's Ctrl-C burst while it
exits (an atexit hook). A long-lived program that runs the launcher many times, and has some of those
runs interrupted, must not pile up one hook per interrupted run (review of audit 16, L7).

Runs in a child interpreter so the hooks and signal handlers it installs never touch pytest's own."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import atexit, json, signal
    from fabricpace.lab import launcher

    def interrupted_run():
        with launcher._stop_signals_interrupt():
            raise KeyboardInterrupt()

    before = atexit._ncallbacks()
    counts = []
    for _ in range(25):
        try:
            interrupted_run()
        except KeyboardInterrupt:
            pass
        counts.append(atexit._ncallbacks() - before)
    print(json.dumps(counts))
""")


def _counts() -> list[int]:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_repeated_interrupted_runs_register_one_atexit_hook() -> None:
    counts = _counts()
    assert counts[0] == 1  # the first interrupted run does register its hook
    assert max(counts) == 1, counts  # 25 interrupted runs: still one hook, not 25


LINGER_CHILD = textwrap.dedent("""
    import atexit, os, signal, time
    from fabricpace.lab import launcher

    # atexit runs hooks last-registered first: this late Ctrl-C of the user's burst, registered
    # before the runs, arrives after the launcher's hook has run, while the interpreter exits.
    atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.2), print("survived")))
    for _ in range(3):
        try:
            with launcher._stop_signals_interrupt():
                raise KeyboardInterrupt()
        except KeyboardInterrupt:
            pass
""")


def test_a_late_ctrl_c_while_exiting_is_still_waited_out() -> None:
    # A guard that the single shared hook changed nothing users see: after several interrupted runs,
    # a Ctrl-C of the burst arriving during exit neither kills the process nor prints a traceback.
    done = subprocess.run([sys.executable, "-c", LINGER_CHILD], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "survived" in done.stdout
    assert "KeyboardInterrupt" not in done.stderr
