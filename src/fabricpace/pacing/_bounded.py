"""Run the controller's update with a time limit, so a controller that never returns (a bug, a
pathological input) turns pacing off on its rank instead of holding the training thread forever.

The update runs on one persistent daemon thread; the training thread waits for it at most the limit.
A call past its limit is abandoned: its result, should it ever come, is dropped, and the pacer is off
from then on, so no second call is made. A thread per window would cost its start every window; the
hand-off to a waiting thread costs tens of microseconds, once per window.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class TimedOut(Exception):
    """The call did not return within its limit."""


class BoundedRunner:
    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def call(self, fn: Callable[[], Any], timeout_s: float) -> Any:
        """``fn()``'s result, or its exception re-raised; TimedOut after ``timeout_s``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
            self._thread.start()
        done = threading.Event()
        box: list[Any] = []
        self._jobs.put((fn, box, done))
        if not done.wait(max(0.0, timeout_s)):
            raise TimedOut(f"no result within {timeout_s:g}s")
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)  # a thread stuck in an abandoned call just never reads it
            self._thread = None

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, box, done = job
            try:
                box.append((True, fn()))
            except BaseException as exc:  # handed to the caller, who decides
                box.append((False, exc))
            done.set()
