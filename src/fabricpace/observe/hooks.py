"""The DDP communication hook wrapper: records each bucket's arrival and completion, reduces the same.

``wrap_hook`` returns a hook for ``DistributedDataParallel.register_comm_hook``. Around the user's
hook — or, by default, around an all-reduce that reproduces DDP's built-in reduction exactly — it
stamps the bucket's arrival (this rank hands the bucket to the collective) and, in the future's
callback, its completion (on gloo this runs on the communication thread when the work finishes).

Why the default multiplies by 1/world *before* the all-reduce: without a hook, DDP's reducer scales
each gradient by 1/world_size while copying it into the bucket, then all-reduces the sum. With a hook
registered the reducer does not scale at all, so the hook must, in the same order and with the same
scalar, for gradients to be bitwise identical to an unobserved run (tested with real gloo ranks).
The instrumentation is wrapped in try/except: if it fails the reduction still happens unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from fabricpace.observe.recorder import _EXIT


def default_allreduce(process_group: Any) -> Callable[[Any, Any], Any]:
    """A hook equal to DDP's built-in reduction: scale by 1/world, all-reduce (sum), return the buffer."""
    import torch.distributed as dist

    from fabricpace.observe.collectives import unwrapped

    # The original, whatever observer's collective wrapper is installed: buckets are recorded once.
    all_reduce = unwrapped("all_reduce")
    group = process_group if process_group is not None else dist.group.WORLD
    # A group's size never changes: the scalar is computed once (the same float DDP uses).
    scale = 1.0 / dist.get_world_size(group)

    # DDP inspects the hook's signature: annotations must be absent or the real torch types, and
    # under `from __future__ import annotations` they would be strings, so the hooks stay unannotated.
    def hook(_state, bucket):  # type: ignore[no-untyped-def]
        buf = bucket.buffer()
        buf.mul_(scale)
        return all_reduce(buf, group=group, async_op=True).get_future()

    return hook


def _first(value: Any) -> Any:
    # The work future of all_reduce yields [tensor]; a user hook's future yields a tensor.
    return value[0] if isinstance(value, list) else value


def _value(f: Any) -> Any:
    return _first(f.value())


def wrap_hook(
    observer: Any, *, user_hook: Callable[[Any, Any], Any] | None, user_state: Any, process_group: Any,
    group_name: str,
) -> Callable[[Any, Any], Any]:
    """A comm hook recording arrival/completion into ``observer`` around ``user_hook`` (or the default).

    Per bucket the hook holds the GIL on the autograd thread for a few µs, and the completion
    callback — which any Python hook needs, to hand DDP a Python value — holds it on gloo's thread
    for one clock read and one list store. Everything else (rows, metrics) happens at step end.
    """
    inner = user_hook if user_hook is not None else default_allreduce(process_group)
    state = user_state if user_hook is not None else None

    def hook(_state, bucket):  # type: ignore[no-untyped-def]
        rec = None
        index = -1
        if observer.recording:
            try:
                index = bucket.index()
                if observer.pacer.pacer is not None:
                    observer.pacer.before_bucket(index)
                buf = bucket.buffer()
                rec = observer.recorder.enter(group_name, "all_reduce", buf.numel() * buf.element_size(),
                                              False)
            except Exception as exc:
                observer.guard.fail("recording", exc)
                observer.recording = False
        fut = inner(state, bucket)
        if rec is None:
            return fut.then(_value)
        mark = observer.recorder.mark

        def done(f: Any) -> Any:
            # Completion first, before anything else can delay the stamp.
            try:
                stamp = rec[_EXIT] = mark()
                if observer.pacer.pacer is not None:
                    # On CUDA the stamp is an event recorded on this callback's stream, which the GPU
                    # reaches after the all-reduce: the comm gate's release (NCCL runs this callback
                    # at enqueue). On CPU it is a clock reading, and this callback runs at completion.
                    observer.pacer.after_bucket(index, stamp if hasattr(stamp, "query") else None)
            except Exception as exc:
                observer.guard.fail("recording", exc)
            value = f.value()
            return value[0] if isinstance(value, list) else value

        return fut.then(done)

    # DDP checks the hook it is given (register_comm_hook -> _check_comm_hook): its signature's
    # annotations and, by __name__, hooks this backend cannot run (bf16_compress_hook without NCCL).
    # The wrapper carries the user's name, qualname and signature (__wrapped__), so that check and
    # DDP's logging see the user's hook, as they would without the observer.
    if user_hook is not None:
        functools.update_wrapper(hook, user_hook)
    return hook
