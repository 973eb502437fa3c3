"""Log-once failure handling: the observer must never hurt the job it watches.

Every part of the observer that can fail (disk, store, a peer, a pacer) reports to a ``Guard``. The
first failure of each kind is logged once with its reason; the caller then switches that part off.
Repeated failures stay silent, so a broken disk cannot flood the training log.
"""

from __future__ import annotations

import logging
import threading

LOG = logging.getLogger("fabricpace.observe")


class Guard:
    """Remembers which parts failed and logs each part's first failure once."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failed: dict[str, str] = {}
        self._lock = threading.Lock()

    def fail(self, part: str, exc: BaseException | str) -> None:
        """Record that ``part`` failed; log it the first time only."""
        with self._lock:
            if part in self.failed:
                return
            reason = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
            self.failed[part] = reason
        LOG.warning(
            "fabricpace observer (rank %d): %s disabled after a failure (%s); training continues",
            self.rank,
            part,
            reason,
        )

    def stop(self, part: str, reason: str) -> None:
        """Switch ``part`` off for a reason that is no failure (a peer stopped observing, as DDP's
        Join makes it do): recorded like a failure (the manifest names it), logged once by rank 0
        only — every rank stops at the same point for the same reason."""
        with self._lock:
            if part in self.failed:
                return
            self.failed[part] = reason
        (LOG.warning if self.rank == 0 else LOG.info)(
            "fabricpace observer (rank %d): %s stopped: %s; training continues", self.rank, part, reason)

    def ok(self, part: str) -> bool:
        return part not in self.failed
