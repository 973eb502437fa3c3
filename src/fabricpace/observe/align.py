"""Clock alignment: each rank's offset to rank 0, NTP-style, with a hard uncertainty bound.

One exchange (round i, rank r ≠ 0) over the side channel:

    rank r:  t1 = now_r();  set req/r/i = t1
    rank 0:  wait req/r/i;  t2 = now_0();  set resp/r/i = t2
    rank r:  wait resp/r/i; t4 = now_r()

With θ = clock_r − clock_0 and only causality assumed (rank 0 reads t2 after r wrote t1; r reads t4
after rank 0 wrote t2): t1 − t2 ≤ θ ≤ t4 − t2. Intersecting the intervals of all rounds gives
[lo, hi]; the estimate is the midpoint and the uncertainty the half width, so the true offset lies
within ``offset ± err`` whenever the clocks do not drift during the exchange (a few milliseconds).
This is NTP's on-wire bound (RFC 5905) without assuming symmetric delays for the error.
Aligned time = local time − offset − t0, where t0 is rank 0's clock at run start.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fabricpace.observe.sidechannel import SideChannel


@dataclass(frozen=True)
class ClockEstimate:
    """Offset of this rank's clock to rank 0's (ns) and the half width of its certain interval."""

    offset_ns: int
    err_ns: int
    rounds: int


def offset_from_rounds(t1: list[int], t2: list[int], t4: list[int]) -> ClockEstimate:
    """Intersect the per-round intervals [t1 − t2, t4 − t2]; fall back to the tightest round."""
    lo = max(a - b for a, b in zip(t1, t2, strict=True))
    hi = min(d - b for d, b in zip(t4, t2, strict=True))
    if lo > hi:  # inconsistent rounds (drift or a clock step): trust the tightest single round
        i = min(range(len(t1)), key=lambda k: t4[k] - t1[k])
        lo, hi = t1[i] - t2[i], t4[i] - t2[i]
    return ClockEstimate(offset_ns=(lo + hi) // 2, err_ns=(hi - lo + 1) // 2, rounds=len(t1))


def exchange(
    channel: SideChannel, *, rank: int, world: int, now: Callable[[], int], rounds: int, epoch: int
) -> ClockEstimate:
    """Run one alignment exchange; every rank calls it with the same epoch. Rank 0 gets offset 0."""
    base = f"clk/{epoch}"
    if rank == 0:
        # Serve rounds in the order ranks send them; each wait is bounded by the channel timeout.
        for i in range(rounds):
            for r in range(1, world):
                channel.wait(f"{base}/req/{r}/{i}")
                channel.set(f"{base}/resp/{r}/{i}", str(now()))
        return ClockEstimate(offset_ns=0, err_ns=0, rounds=rounds)
    t1s: list[int] = []
    t2s: list[int] = []
    t4s: list[int] = []
    for i in range(rounds):
        t1 = now()
        channel.set(f"{base}/req/{rank}/{i}", str(t1))
        channel.wait(f"{base}/resp/{rank}/{i}")
        t4 = now()
        t2 = int(channel.get(f"{base}/resp/{rank}/{i}"))
        t1s.append(t1)
        t2s.append(t2)
        t4s.append(t4)
    return offset_from_rounds(t1s, t2s, t4s)
