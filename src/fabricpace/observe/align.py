"""Clock alignment: each rank's offset to rank 0, NTP-style, with a hard uncertainty bound.

Only one process per clock domain needs an exchange. A domain is one kernel's CLOCK_MONOTONIC
(``/proc/sys/kernel/random/boot_id``; containers on one host share it): every rank of a node reads the
same clock, so the node's first rank (its *leader*) measures the offset and the node's other ranks
adopt it; ranks in rank 0's domain have offset 0 exactly. On a job of hundreds of nodes this turns
thousands of exchanges into one per node.

One round with a leader r (rank 0 serves the leaders one at a time):

    rank 0:  set go/r/i
    rank r:  wait go/r/i;  t1 = now_r();  set req/r/i = t1
    rank 0:  wait req/r/i; t2 = now_0();  set resp/r/i = t2
    rank r:  wait resp/r/i; t4 = now_r()

With θ = clock_r − clock_0 and only causality assumed (rank 0 reads t2 after r wrote t1; r reads t4
after rank 0 wrote t2): t1 − t2 ≤ θ ≤ t4 − t2. Intersecting the intervals of all rounds gives
[lo, hi]; the estimate is the midpoint and the uncertainty the half width, so the true offset lies
within ``offset ± err`` whenever the clocks do not drift during the exchange (a few milliseconds).
This is NTP's on-wire bound (RFC 5905) without assuming symmetric delays for the error.

Why the ``go`` key: without it every rank posts its request at once and rank 0 answers them in turn,
so the last rank's request waits for all the others — its interval, and the bias of the midpoint,
grew with the number of ranks (measured here, 32 ranks on one host whose true offsets are all 0:
estimates of −2.0 ms ± 2.2 ms). With ``go`` a request is posted only when rank 0 is ready to read
it, and the width stays a few Store round trips whatever the job's size.
Aligned time = local time − offset − t0, where t0 is rank 0's clock at run start.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fabricpace.observe.sidechannel import SideChannel

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


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


def clock_domain(shift_ns: int = 0) -> str | None:
    """The id of the clock this process reads (None when unknown: the rank then measures its own
    offset). A test shift (``FABRICPACE_CLOCK_SHIFT_NS``) makes a clock of its own."""
    try:
        boot = _BOOT_ID.read_text().strip()
    except OSError:
        return None
    if not boot:
        return None
    return f"{boot}+{shift_ns}" if shift_ns else boot


class ClockSync:
    """Repeated alignment exchanges of one rank. The first one also settles who measures (one leader
    per clock domain); later epochs reuse that plan."""

    def __init__(
        self, channel: SideChannel, *, rank: int, world: int, now: Callable[[], int], rounds: int,
        domain: str | None = None,
    ) -> None:
        self.channel, self.rank, self.world, self.now, self.rounds = channel, rank, world, now, rounds
        self.domain = domain
        self._leaders: list[int] | None = None  # rank 0: the ranks that measure
        self._role: str | None = None  # other ranks: "lead:<domain key>" or "follow:<domain key>"

    def _plan(self, base: str) -> None:
        ch = self.channel
        if self.rank != 0:
            ch.set(f"{base}/domain/{self.rank}", self.domain or f"rank-{self.rank}")
            self._role = ch.get(f"{base}/role/{self.rank}").decode()
            return
        own = self.domain or "rank-0"
        doms = [own] + [ch.get(f"{base}/domain/{r}").decode() for r in range(1, self.world)]
        first: dict[str, int] = {}
        for r, dom in enumerate(doms):
            first.setdefault(dom, r)
        key = {dom: i for i, dom in enumerate(first)}  # rank 0's domain is key 0
        for r in range(1, self.world):
            kind = "lead" if first[doms[r]] == r else "follow"
            ch.set(f"{base}/role/{r}", f"{kind}:{key[doms[r]]}")
        self._leaders = [r for r in first.values() if r != 0]

    def exchange(self, epoch: int) -> ClockEstimate:
        """One alignment; every rank calls it with the same epoch. Rank 0 gets offset 0."""
        ch = self.channel
        base = f"clk/{epoch}"
        if self.world <= 1:
            return ClockEstimate(offset_ns=0, err_ns=0, rounds=0)
        if self._leaders is None and self._role is None:
            self._plan("clk/plan")
        if self.rank == 0:
            assert self._leaders is not None
            ch.set(f"{base}/res/0", json.dumps([0, 0, 0]))  # ranks on rank 0's clock
            for i in range(self.rounds):
                for r in self._leaders:
                    ch.set(f"{base}/go/{r}/{i}", "1")
                    ch.wait(f"{base}/req/{r}/{i}")
                    ch.set(f"{base}/resp/{r}/{i}", str(self.now()))
            return ClockEstimate(offset_ns=0, err_ns=0, rounds=self.rounds)
        assert self._role is not None
        kind, _, key = self._role.partition(":")
        if kind == "follow":
            off, err, rounds = json.loads(ch.get(f"{base}/res/{key}"))
            return ClockEstimate(offset_ns=int(off), err_ns=int(err), rounds=int(rounds))
        t1s: list[int] = []
        t2s: list[int] = []
        t4s: list[int] = []
        for i in range(self.rounds):
            ch.wait(f"{base}/go/{self.rank}/{i}")
            t1 = self.now()
            ch.set(f"{base}/req/{self.rank}/{i}", str(t1))
            ch.wait(f"{base}/resp/{self.rank}/{i}")
            t4 = self.now()
            t2 = int(ch.get(f"{base}/resp/{self.rank}/{i}"))
            t1s.append(t1)
            t2s.append(t2)
            t4s.append(t4)
        est = offset_from_rounds(t1s, t2s, t4s)
        ch.set(f"{base}/res/{key}", json.dumps([est.offset_ns, est.err_ns, est.rounds]))
        # Rank 0 is done with this leader's keys: remove them, or a long job leaves 36 per leader and
        # re-alignment in the Store (1.8 M keys after 200 re-alignments of 256 nodes).
        for i in range(self.rounds):
            for kind in ("go", "req", "resp"):
                ch.delete(f"{base}/{kind}/{self.rank}/{i}")
        return est


def exchange(
    channel: SideChannel, *, rank: int, world: int, now: Callable[[], int], rounds: int, epoch: int,
    domain: str | None = None,
) -> ClockEstimate:
    """One exchange without a kept plan (tests, one-off use): see ``ClockSync``."""
    return ClockSync(channel, rank=rank, world=world, now=now, rounds=rounds, domain=domain).exchange(epoch)
