"""A key-value side channel beside the process group (torch.distributed Store), with timeouts.

The observer never puts its own coordination on the training process group's hot path: start-up
information (run start, run directory, rank locality), clock exchanges and close-down handshakes go
through the job's Store under a per-session prefix. Every blocking call has an explicit timeout, so
a peer that is gone costs at most one timeout, after which the caller degrades.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any


class SideChannel:
    """Prefixed Store access with explicit timeouts (``None`` store = single process, local dict)."""

    def __init__(self, store: Any, prefix: str, timeout_s: float) -> None:
        self.store = store
        self.prefix = prefix.rstrip("/") + "/"
        self.timeout = timedelta(seconds=timeout_s)
        self._local: dict[str, bytes] = {}

    def set(self, key: str, value: str | bytes) -> None:
        data = value.encode() if isinstance(value, str) else value
        if self.store is None:
            self._local[key] = data
        else:
            self.store.set(self.prefix + key, data)

    def get(self, key: str, timeout_s: float | None = None) -> bytes:
        """Wait (at most the timeout) for ``key`` and return its value."""
        if self.store is None:
            if key not in self._local:
                raise TimeoutError(f"side channel: key {key!r} never set")
            return self._local[key]
        timeout = self.timeout if timeout_s is None else timedelta(seconds=timeout_s)
        self.store.wait([self.prefix + key], timeout)
        return bytes(self.store.get(self.prefix + key))

    def wait(self, key: str, timeout_s: float | None = None) -> None:
        if self.store is None:
            if key not in self._local:
                raise TimeoutError(f"side channel: key {key!r} never set")
            return
        timeout = self.timeout if timeout_s is None else timedelta(seconds=timeout_s)
        self.store.wait([self.prefix + key], timeout)

    def delete(self, key: str) -> None:
        """Remove a key that is no longer needed (a Store keeps every key for the job's lifetime)."""
        if self.store is None:
            self._local.pop(key, None)
        else:
            self.store.delete_key(self.prefix + key)

    def set_json(self, key: str, value: Any) -> None:
        self.set(key, json.dumps(value))

    def get_json(self, key: str, timeout_s: float | None = None) -> Any:
        return json.loads(self.get(key, timeout_s).decode())


def default_store() -> Any:
    """The observer's Store: its own client connection to the job's TCPStore when there is one,
    else the default process group's Store (None when torch.distributed is not up).

    Why a connection of its own: a TCPStore client serializes its operations, and a blocking
    ``wait`` holds that lock for as long as it waits. Sharing the job's client would let the
    background clock thread's waits (up to ``store_timeout_s``) stall any Store use of the training
    thread — ``dist.new_group``, another library, a second observer (seen in the benchmark: two
    observers' clock exchanges blocked each other for 20 s). Every rank takes the same path (same
    torch, same store type), so the key space agrees across ranks.
    """
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        from torch.distributed import distributed_c10d

        shared = distributed_c10d._get_default_store()
    except Exception:  # a missing private API must not stop the job; the caller falls back
        return None
    try:
        base = shared
        while isinstance(base, dist.PrefixStore):
            base = base.underlying_store
        if isinstance(base, dist.TCPStore):
            # Store.timeout exists at run time but not in the type stubs.
            timeout = base.timeout  # type: ignore[attr-defined]
            client = dist.TCPStore(base.host, base.port, is_master=False, timeout=timeout,
                                   wait_for_workers=False)
            return dist.PrefixStore("fabricpace-observer", client)
    except Exception:  # no second connection: share the job's client (correct, only less isolated)
        pass
    return shared
