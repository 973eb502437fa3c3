"""Opt-in instrumentation of plain torch.distributed collectives (FSDP2, custom loops).

``CollectiveWrapper`` replaces the module functions ``torch.distributed.all_reduce``,
``all_gather``, ``all_gather_into_tensor``, ``reduce_scatter``, ``reduce_scatter_tensor``,
``broadcast``, ``all_to_all_single``, ``barrier``, ``all_gather_single`` and ``reduce_scatter_single``
(the last two where this torch has them: FSDP2 uses them) by thin wrappers that stamp arrival and
completion. Code that calls them through the module (``dist.all_reduce(...)``) is seen; code holding
a direct reference from before the installation is not. Arguments and results pass through untouched.

``group`` and ``async_op`` are found where the caller put them, by keyword or by position (FSDP1
passes the group positionally): their positions are read once from each function's signature, so a
call costs two index checks, not a signature binding.

One installation per process, shared by every observer that asked for it: the wrappers go in when
the first such observer starts and the originals come back when the last one closes, whatever the
order the observers close in (each call is recorded by every observer recording at that moment).
Collectives on an observer's own gloo group (its window gathers, its start-up agreement) are never
recorded, and observers issue theirs through the unwrapped functions (``unwrapped``).

Synchronous calls complete on return: their whole duration is wait. ``async_op=True`` calls
complete in the work future's callback (``t_exit``); the time the step was blocked on them is the
time spent in the returned ``Work``'s ``wait()`` (``Work.wait`` is wrapped while installed, with a
lookup that costs unrelated works one dictionary probe). Host work done while the collective is in
flight is compute, not wait. An async collective never waited through ``Work.wait`` (only through
its future, or not at all) adds no wait.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref
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
_NOT_POSITIONAL = 1 << 30  # a parameter index no call reaches: found by keyword only

# The process-wide installation (guarded by _LOCK; the wrappers read the tuples without it).
_LOCK = threading.Lock()
_ACTIVE: tuple[Any, ...] = ()  # observers whose wrapper is installed, in the order they started
_ORIGINALS: dict[str, Callable[..., Any]] = {}  # op -> the function found at installation
_WRAPPERS: dict[str, Callable[..., Any]] = {}  # op -> our wrapper of _ORIGINALS[op]
_INTERNAL: dict[int, Any] = {}  # id -> an observer's private group (kept alive: ids stay unique)
_WAIT: list[Any] = []  # [Work class, its original wait, our wrapper] while Work.wait is wrapped
# Work -> [(observer, record)] of async calls not yet waited (weak: a dropped Work leaves no entry).
_PENDING: weakref.WeakKeyDictionary[Any, list[tuple[Any, list[Any]]]] = weakref.WeakKeyDictionary()


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


def positions(fn: Callable[..., Any]) -> tuple[int, int]:
    """Positional indices of ``group`` and ``async_op`` in ``fn``'s signature (``_NOT_POSITIONAL``
    where the parameter is keyword-only, absent, or the signature cannot be read)."""
    found = {"group": _NOT_POSITIONAL, "async_op": _NOT_POSITIONAL}
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return found["group"], found["async_op"]
    for i, p in enumerate(params):
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
        if p.name in found:
            found[p.name] = i
    return found["group"], found["async_op"]


def unwrapped(op: str) -> Callable[..., Any]:
    """``torch.distributed.<op>`` without any observer's wrapper (the observer's own collectives)."""
    import torch.distributed as dist

    with _LOCK:
        original = _ORIGINALS.get(op)
    return original if original is not None else getattr(dist, op)


def internal_group(group: Any) -> None:
    """Mark an observer's private group: collectives on it are never recorded, by any observer."""
    if group is not None:
        with _LOCK:
            _INTERNAL[id(group)] = group


def _exit_all(recs: list[tuple[Any, list[Any]]]) -> None:
    for obs, rec in recs:
        try:
            obs.recorder.exit(rec)
        except Exception as exc:
            obs.guard.fail("recording", exc)


class _Tag:
    """Marks one of our wrappers (``wrapper._fabricpace_wrap``): what it wraps, and whether it records
    (a wrapper someone patched over at uninstall stays in their chain and only passes calls through)."""

    __slots__ = ("live", "original", "wrapper")

    def __init__(self, wrapper: Callable[..., Any], original: Callable[..., Any], live: list[bool]) -> None:
        self.wrapper, self.original, self.live = wrapper, original, live


def _wrap(op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    group_at, async_at = positions(fn)
    first = min(group_at, async_at)
    live = [True]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        active = _ACTIVE
        if not active or not live[0]:
            return fn(*args, **kwargs)
        if len(args) > first:  # group or async_op passed by position (rare: one more compare each)
            n = len(args)
            group = args[group_at] if n > group_at else kwargs.get("group")
            is_async = args[async_at] if n > async_at else kwargs.get("async_op", False)
        else:
            group = kwargs.get("group")
            is_async = kwargs.get("async_op", False)
        if group is not None and id(group) in _INTERNAL:
            return fn(*args, **kwargs)
        # Async rows count no wait themselves: their Work.wait() does (see the module docstring).
        kind = (None if _WAIT else False) if is_async else True
        if len(active) == 1:  # the usual case, kept as lean as one observer's wrapper always was
            obs = active[0]
            if not obs.recording:
                return fn(*args, **kwargs)
            try:
                rec = obs.recorder.enter(group_name(group), op, _nbytes(args, kwargs), kind)
            except Exception as exc:
                obs.guard.fail("recording", exc)
                return fn(*args, **kwargs)
            work = fn(*args, **kwargs)
            try:
                if is_async and work is not None:
                    exit_ = obs.recorder.exit
                    work.get_future().then(lambda _f: exit_(rec))
                    if _WAIT:
                        _PENDING[work] = [(obs, rec)]
                else:
                    obs.recorder.exit(rec)
            except Exception as exc:
                obs.guard.fail("recording", exc)
            return work
        recs: list[tuple[Any, list[Any]]] = []
        name = nbytes = None
        for obs in active:
            if obs.recording:
                try:
                    if name is None:
                        name, nbytes = group_name(group), _nbytes(args, kwargs)
                    recs.append((obs, obs.recorder.enter(name, op, nbytes, kind)))
                except Exception as exc:
                    obs.guard.fail("recording", exc)
        work = fn(*args, **kwargs)
        if recs:
            if is_async and work is not None:
                try:
                    work.get_future().then(lambda _f: _exit_all(recs))
                    if _WAIT:
                        _PENDING[work] = recs
                except Exception as exc:
                    recs[0][0].guard.fail("recording", exc)
            else:
                _exit_all(recs)
        return work

    wrapper._fabricpace_wrap = _Tag(wrapper, fn, live)  # type: ignore[attr-defined]
    return wrapper


def _wrap_wait(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        recs = _PENDING.pop(self, None) if _PENDING else None
        if recs is None:
            return original(self, *args, **kwargs)
        marks = []
        for obs, _ in recs:
            if obs.recording:
                try:
                    marks.append((obs, obs.recorder.mark()))
                except Exception as exc:
                    obs.guard.fail("recording", exc)
        try:
            return original(self, *args, **kwargs)
        finally:
            for obs, t_in in marks:
                try:
                    obs.recorder.blocked(t_in, obs.recorder.mark())
                except Exception as exc:
                    obs.guard.fail("recording", exc)

    return wait


def _install_locked() -> None:
    import torch.distributed as dist

    for op in WRAPPED:
        current = getattr(dist, op, None)
        if current is None:
            continue
        tag = getattr(current, "_fabricpace_wrap", None)
        if isinstance(tag, _Tag) and tag.wrapper is current:
            # Ours, left in place at an earlier uninstall (a patch was over it, since removed): it
            # records again; a second wrapper around it would record every call twice.
            tag.live[0] = True
            _ORIGINALS[op], _WRAPPERS[op] = tag.original, current
            continue
        _ORIGINALS[op] = current
        _WRAPPERS[op] = _wrap(op, current)
        setattr(dist, op, _WRAPPERS[op])
    work = getattr(dist, "Work", None)
    if work is not None and not _WAIT:
        try:
            original = work.wait
            timed = _wrap_wait(original)
            work.wait = timed
            _WAIT.extend((work, original, timed))
        except (AttributeError, TypeError):  # a Work class that takes no attribute: async waits unmeasured
            pass


def _uninstall_locked() -> None:
    import torch.distributed as dist

    for op, wrapper in _WRAPPERS.items():
        if getattr(dist, op, None) is wrapper:
            setattr(dist, op, _ORIGINALS[op])
        else:  # someone patched over it: it stays in their chain (not clobbered), passing calls through
            wrapper._fabricpace_wrap.live[0] = False  # type: ignore[attr-defined]
    _WRAPPERS.clear()
    _ORIGINALS.clear()
    if _WAIT:
        work, original, timed = _WAIT
        if getattr(work, "wait", None) is timed:  # (under someone's patch it passes waits through)
            work.wait = original
        _WAIT.clear()
    _PENDING.clear()


class CollectiveWrapper:
    """One observer's share of the process-wide installation (see the module docstring)."""

    def __init__(self, observer: Any) -> None:
        self.observer = observer
        self.installed = False

    def install(self) -> None:
        global _ACTIVE
        with _LOCK:
            if self.installed:
                return
            if not _ACTIVE:
                _install_locked()
            _ACTIVE = (*_ACTIVE, self.observer)
            self.installed = True

    def uninstall(self) -> None:
        global _ACTIVE
        with _LOCK:
            if not self.installed:
                return
            self.installed = False
            _ACTIVE = tuple(o for o in _ACTIVE if o is not self.observer)
            if not _ACTIVE:
                _uninstall_locked()
