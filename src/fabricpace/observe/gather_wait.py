"""Waiting for a window gather that a peer may never join because it stopped observing.

Real loops let ranks stop observing at different steps without any error: DDP's ``Join`` context
for uneven inputs (a rank with fewer batches leaves its loop, and its ``with fabricpace.observe``
block, while the others keep training), or a rank that calls ``obs.close()`` early. A rank that
closed never starts another window gather, so its peers' next gather cannot complete, and a plain
``work.wait()`` held their training for ``gather_timeout_s`` (30 s by default) before the guard
switched gathers off.

Protocol (one Store counter per window index, in the observer's own key space): a closing rank
adds 1 to ``left/<W>``, W = the number of window vectors it sent, i.e. the index of the first gather
it will never join. A rank whose gather ``g`` is not complete when it is due polls the gather's
completion (no Store call while it completes within ``_QUIET_S``); after that, a helper thread reads
``left/<g>`` every ``_POLL_S`` and the wait ends as soon as a peer is known to have left before
gather ``g``. The training thread never calls the Store here: a Store operation can queue behind the
clock thread's wait on the same client. Peers that closed *after* joining gather ``g`` counted under
a larger index, so the normal end of a run (every rank closes after the same windows) never cuts a
gather short.
"""

from __future__ import annotations

import threading
import time
from typing import Any

_QUIET_S = 0.05  # a gather still running after this long is worth a Store look
_POLL_S = 0.05  # Store reads of the counter while waiting (one round trip each, on a helper thread)


def left_key(window_index: int) -> str:
    return f"left/{int(window_index)}"


def mark_left(channel: Any, windows_sent: int) -> None:
    """Closing: say that this rank joins no gather from index ``windows_sent`` on (one Store add)."""
    channel.add(left_key(windows_sent), 1)


def wait_gather(work: Any, channel: Any, index: int, timeout_s: float) -> str | None:
    """Wait for gather ``index``: None when it completed (``work.wait()`` then returns at once), else
    why it was given up — a peer closed before joining it, or ``timeout_s`` passed. The work is then
    left to the private group's own timeout; the caller switches gathers off."""
    if work.is_completed():
        work.wait()
        return None
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    left: list[int] = []
    stop = threading.Event()
    watcher: threading.Thread | None = None
    pause = 2e-5
    try:
        while not work.is_completed():
            now = time.monotonic()
            if now >= deadline:
                return f"the window gather did not complete within gather_timeout_s ({timeout_s:g} s)"
            if left:
                return (f"{left[0]} peer(s) stopped observing before window gather {index} (closed early, "
                        "or out of inputs under DDP Join); no window summaries from here on")
            if watcher is None and now - t0 >= _QUIET_S and channel is not None:
                watcher = threading.Thread(target=_watch, args=(channel, index, left, stop),
                                           name="fabricpace-gather-wait", daemon=True)
                watcher.start()
            time.sleep(pause)
            pause = min(pause * 2, 2e-3)  # adds at most about the time already waited (backoff)
        work.wait()  # completed: returns at once and raises if the gather failed
        return None
    finally:
        stop.set()


def _watch(channel: Any, index: int, left: list[int], stop: threading.Event) -> None:
    key = left_key(index)
    while not stop.is_set():
        try:
            n = channel.add(key, 0)
        except Exception:  # the Store is gone: the deadline still bounds the wait
            return
        if n > 0:
            left.append(int(n))
            return
        stop.wait(_POLL_S)
