"""In-process observer: arrival-level telemetry from real PyTorch jobs at negligible cost.

    import fabricpace
    with fabricpace.observe(ddp_model, run_dir="runs/exp1") as obs:
        for batch in loader:
            with obs.step(samples=len(batch)):
                ...

Modules, one concept each: ``clocks`` (CPU clock, CUDA/fake event timelines), ``align`` (clock
offsets), ``sidechannel`` (Store with timeouts), ``recorder`` (hot path), ``ddp_probe`` (hook-free DDP
bucket arrivals, the default), ``hooks`` (DDP comm hook),
``collectives`` (plain-collective wrapper), ``chunks`` (crash-safe writer thread), ``windows``
(window summaries and the arrival block), ``status`` (status line, Prometheus), ``locality``
(host/NUMA/GPU/NIC probe), ``pacer`` (pacing hook calls), ``startup`` (rank/world, run
directory, ranks table), ``shutdown`` (closing after an error or with a frozen Store), ``observer``
(the Observer). torch is imported only when a distributed
feature is used, so this package imports without it.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

from fabricpace.observe.config import ObserverConfig
from fabricpace.observe.observer import Observer

__all__ = ["Observer", "ObserverConfig", "observe"]


def observe(
    model: Any = None,
    run_dir: str | os.PathLike[str] | None = None,
    *,
    pacing: Any = "off",
    window: int | None = None,
    metrics_port: int | None = None,
    config: ObserverConfig | None = None,
    comm_hook: tuple[Any, Any] | None = None,
    wrap_collectives: bool = False,
) -> Observer:
    """Start observing this rank; use as a context manager (or call ``close()``).

    model: a DDP-wrapped module (its buckets are recorded; by default without a comm hook, see
        ObserverConfig.ddp_instrumentation) or None.
    run_dir: where to write; default $FABRICPACE_RUN_DIR or runs/<UTC time>. A non-empty directory
        is never overwritten: the run goes to the first free ``run_dir-N`` (logged).
    pacing: "off" (default), a mode for ``fabricpace.pacing.make_pacer``, or a pacer object.
    window: steps per window summary (default 50).
    metrics_port: serve Prometheus metrics on 127.0.0.1:PORT from rank 0.
    comm_hook: ``(state, hook)`` — your own DDP comm hook; it is registered wrapped, so do not
        register it on the model yourself (DDP accepts one hook).
    wrap_collectives: also record torch.distributed.all_reduce & co. called through the module.
    """
    return Observer(
        model,
        run_dir,
        pacing=pacing,
        window=window,
        metrics_port=metrics_port,
        config=config,
        comm_hook=comm_hook,
        wrap_collectives=wrap_collectives,
    )


class _CallableModule(types.ModuleType):
    """``fabricpace.observe`` is both this package and the function: importing a submodule makes
    Python set the package attribute ``fabricpace.observe`` to this module, so the module itself
    forwards calls to ``observe()`` and ``fabricpace.observe(model, ...)`` works either way."""

    def __call__(self, *args: Any, **kwargs: Any) -> Observer:
        return observe(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
