"""Waits that grow with the job (audit 17 A3 finding 4): the clock followers' and leaders' waits and
rank 0's close budget at 512 and 4,096 ranks; the close handshake as one Store wait on every rank's
key (a real TCPStore with 4,096 keys); rank 0's failed clock exchange releasing the followers at once.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from fabricpace.observe import align, shutdown
from fabricpace.observe.sidechannel import SideChannel


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------ waits that grow with the job
def test_clock_waits_scale_with_the_leaders_and_are_bounded():
    base = 20.0
    # A follower waits for clock_rounds (12) × leaders exchanges: 512 nodes -> 511 leaders.
    assert align.scaled_wait_s(base, 12 * 511) == pytest.approx(50.66)
    # 4,096 ranks of one GPU each: 4,095 leaders, 265.7 s (before: 20 s, which ~7 s of serving
    # reaches at ~1,500 nodes); never more than WAIT_MAX_S.
    assert align.scaled_wait_s(base, 12 * 4095) == pytest.approx(265.7)
    assert align.scaled_wait_s(base, 12 * 16383) == align.WAIT_MAX_S
    assert align.scaled_wait_s(base, 0) == base
    assert align.scaled_wait_s(400.0, 10**6) == 400.0  # never below store_timeout_s
    # A leader waits for rank 0 to serve the other leaders once between two rounds.
    assert align.scaled_wait_s(base, 511) == pytest.approx(22.555)
    # Rank 0's plan: one get per rank, all in one request; the ranks' role wait allows 1 ms each.
    assert align.scaled_wait_s(base, 4096, per_round_s=align.PLAN_PER_RANK_S) == pytest.approx(24.096)


def test_close_budget_scales_with_the_ranks_and_is_bounded():
    assert shutdown.close_budget_s(10.0, 2) == pytest.approx(10.002)
    assert shutdown.close_budget_s(10.0, 512) == pytest.approx(10.512)
    assert shutdown.close_budget_s(10.0, 4096) == pytest.approx(14.096)
    assert shutdown.close_budget_s(10.0, 10**6) == 70.0


def _store_pair(world: int):
    import torch.distributed as dist

    port = _free_port()
    master = dist.TCPStore("127.0.0.1", port, world, True, wait_for_workers=False)
    return [master] + [dist.TCPStore("127.0.0.1", port, world, False) for _ in range(world - 1)]


def test_close_handshake_waits_on_every_rank_at_once_on_a_real_store():
    pytest.importorskip("torch")
    world = 4096
    store, peer = _store_pair(2)
    ch, other = SideChannel(store, "c", 5.0), SideChannel(peer, "c", 5.0)
    missing = {17, 4000}
    other.set_many({f"closed/{r}": "1" for r in range(world) if r not in missing})
    t = time.perf_counter()
    assert shutdown.unclosed_ranks(ch, world, 0.5) == sorted(missing)  # after the budget, named
    assert time.perf_counter() - t < 0.5 + 5
    # The late ones close while rank 0 waits: one wait returns as soon as the last key is set.
    later = threading.Timer(0.3, lambda: other.set_many({f"closed/{r}": "1" for r in missing}))
    later.start()
    t = time.perf_counter()
    assert shutdown.unclosed_ranks(ch, world, 10.0) == []
    waited = time.perf_counter() - t
    later.join()
    assert 0.25 < waited < 3, waited


def test_followers_learn_that_rank_0_gave_up_the_exchange():
    pytest.importorskip("torch")
    # Ranks 1 and 2 share a clock; rank 1 (their leader) plans, then never exchanges. Rank 0's wait
    # for its request runs out (store_timeout_s 1 s); rank 2 then reads "failed" instead of waiting.
    stores = _store_pair(3)
    domains = ["a", "b", "b"]
    syncs = [align.ClockSync(SideChannel(s, "x", 1.0), rank=r, world=3, now=time.perf_counter_ns,
                             rounds=4, domain=domains[r]) for r, s in enumerate(stores)]
    errors: dict[int, BaseException] = {}

    def run(r: int) -> None:
        try:
            if r == 1:
                syncs[1]._plan("clk/plan")
            else:
                syncs[r].exchange(0)
        except Exception as exc:
            errors[r] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert syncs[1]._n_leaders == 1 and syncs[2]._n_leaders == 1  # the count rides on the role
    assert 0 in errors and 1 not in errors
    assert isinstance(errors[2], RuntimeError) and "rank 0 gave up the clock exchange" in str(errors[2])
