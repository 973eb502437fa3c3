"""Clock alignment over a real TCPStore: a known offset is recovered within the reported bound."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from fabricpace.observe.align import exchange, offset_from_rounds
from fabricpace.observe.sidechannel import SideChannel


def test_bound_contains_true_offset_for_asymmetric_delays():
    theta = 5_000  # rank clock ahead of rank 0 by 5 µs; one-way delays 1 µs out, 30 µs back
    t1 = [100_000, 200_000]
    t2 = [t - theta + 1_000 for t in t1]
    t4 = [b + theta + 30_000 for b in t2]
    est = offset_from_rounds(t1, t2, t4)
    assert abs(est.offset_ns - theta) <= est.err_ns
    assert est.err_ns <= 16_000


def test_inconsistent_rounds_fall_back_to_tightest():
    est = offset_from_rounds([0, 100], [10, 200], [20, 150])
    assert est.rounds == 2 and est.err_ns >= 0


def test_exchange_over_real_store_recovers_37ms():
    torch = pytest.importorskip("torch")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    master = torch.distributed.TCPStore("127.0.0.1", port, 2, True, wait_for_workers=False)
    client = torch.distributed.TCPStore("127.0.0.1", port, 2, False)
    shift = 37_000_000
    results = {}

    def run(rank, store, now):
        ch = SideChannel(store, "t", 10.0)
        results[rank] = exchange(ch, rank=rank, world=2, now=now, rounds=8, epoch=0)

    t0 = threading.Thread(target=run, args=(0, master, time.perf_counter_ns))
    t1 = threading.Thread(target=run, args=(1, client, lambda: time.perf_counter_ns() + shift))
    t0.start()
    t1.start()
    t0.join(30)
    t1.join(30)
    est = results[1]
    assert abs(est.offset_ns - shift) <= est.err_ns
    assert est.err_ns < 10_000_000
    assert results[0].offset_ns == 0


def test_exchange_times_out_when_peer_is_gone():
    ch = SideChannel(None, "x", 0.1)
    with pytest.raises(TimeoutError):
        exchange(ch, rank=1, world=2, now=time.perf_counter_ns, rounds=2, epoch=0)
