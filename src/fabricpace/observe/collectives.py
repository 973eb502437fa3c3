"""Opt-in instrumentation of plain torch.distributed collectives (FSDP2, custom loops).

``CollectiveWrapper`` replaces the module functions ``torch.distributed.all_reduce``,
``all_gather``, ``all_gather_into_tensor``, ``reduce_scatter``, ``reduce_scatter_tensor``,
``broadcast``, ``all_to_all_single``, ``barrier``, ``all_gather_single`` and ``reduce_scatter_single``
(the last two where this torch has them: FSDP2 uses them) by thin wrappers that stamp arrival and
completion, and restores the originals on ``uninstall``. Code that calls them through the module
(``dist.all_reduce(...)``) is seen; code holding a direct reference from before ``install`` is not.
Synchronous calls complete on return; ``async_op=True`` calls complete in the work future's
callback. Arguments and results pass through untouched.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

WRAPPED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "all_to_all_single",
    "barrier",
    # torch >= 2.10's single-tensor forms: FSDP2 (fully_shard) issues its parameter all-gathers and
    # gradient reduce-scatters through these, not through the *_tensor names (torch 2.13).
    "all_gather_single",
    "reduce_scatter_single",
)


def _nbytes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Bytes of the first tensor argument (or of a list of tensors)."""
    for value in (*args, *kwargs.values()):
        if hasattr(value, "element_size") and hasattr(value, "numel"):
            return int(value.numel() * value.element_size())
        if isinstance(value, list | tuple) and value and hasattr(value[0], "element_size"):
            return int(sum(t.numel() * t.element_size() for t in value))
    return 0


def group_name(group: Any) -> str:
    """The cross-rank name of a process group ('world' for the default group)."""
    if group is None:
        return "world"
    try:
        import torch.distributed as dist

        if group is dist.group.WORLD:
            return "world"
    except Exception:  # torch.distributed unavailable: a custom group object
        pass
    return str(getattr(group, "group_name", None) or "group")


class CollectiveWrapper:
    """Patches torch.distributed's collectives to report into an observer."""

    def __init__(self, observer: Any) -> None:
        self.observer = observer
        self._originals: dict[str, Callable[..., Any]] = {}

    def _wrap(self, op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        obs = self.observer

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            rec = None
            is_async = bool(kwargs.get("async_op", False))
            if obs.recording:
                try:
                    rec = obs.recorder.enter(group_name(kwargs.get("group")), op, _nbytes(args, kwargs),
                                             not is_async)
                except Exception as exc:
                    obs.guard.fail("recording", exc)
            work = fn(*args, **kwargs)
            if rec is not None:
                try:
                    if is_async and work is not None:
                        work.get_future().then(lambda _f: obs.recorder.exit(rec))
                    else:
                        obs.recorder.exit(rec)
                except Exception as exc:
                    obs.guard.fail("recording", exc)
            return work

        return wrapper

    def install(self) -> None:
        import torch.distributed as dist

        for op in WRAPPED:
            fn = getattr(dist, op, None)
            if fn is None or op in self._originals:
                continue
            self._originals[op] = fn
            setattr(dist, op, self._wrap(op, fn))

    def uninstall(self) -> None:
        import torch.distributed as dist

        for op, fn in self._originals.items():
            setattr(dist, op, fn)
        self._originals.clear()
