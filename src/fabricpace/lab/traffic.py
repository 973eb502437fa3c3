"""Bulk TCP traffic between lab namespaces: the uplink measurement and the foreign-flow fault.

Run as ``python -m fabricpace.lab.traffic recv|send ...`` inside a namespace (``ip netns exec``). Every
transfer is bounded in time and bytes, and the sender refuses any address outside the lab subnet, so
this can never load a real network.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from fabricpace._errors import LabError
from fabricpace.lab import state
from fabricpace.lab.config import SUBNET, LabConfig

CHUNK = 64 * 1024
MEASURE_PORT = 5201
FOREIGN_PORT = 5202


def _recv(port: int, duration: float, max_bytes: int, streams: int) -> dict[str, Any]:
    """Accept ``streams`` connections and count bytes; sample cumulative bytes every 50 ms."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(streams)
    print("listening", flush=True)  # the launcher waits for this line before starting the sender
    srv.settimeout(duration + 10)
    total = [0]
    lock = threading.Lock()
    stop_at = [float("inf")]

    def drain(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(1.0)
            while time.monotonic() < stop_at[0]:
                try:
                    data = conn.recv(CHUNK)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                with lock:
                    total[0] += len(data)
                    if total[0] >= max_bytes:
                        return

    threads: list[threading.Thread] = []
    samples: list[tuple[float, int]] = []
    for _ in range(streams):
        try:
            conn, _addr = srv.accept()
        except TimeoutError:
            break
        if not threads:
            t0 = time.monotonic()
            stop_at[0] = t0 + duration + 5
        th = threading.Thread(target=drain, args=(conn,), daemon=True)
        th.start()
        threads.append(th)
    srv.close()
    if not threads:
        return {"bytes": 0, "samples": []}
    while any(th.is_alive() for th in threads):
        with lock:
            samples.append((time.monotonic() - t0, total[0]))
        time.sleep(0.05)
    samples.append((time.monotonic() - t0, total[0]))
    return {"bytes": total[0], "samples": samples}


def _send(addr: str, port: int, duration: float, max_bytes: int, streams: int,
          on_s: float, off_s: float, log: str | None) -> dict[str, Any]:
    if not addr.startswith(SUBNET + "."):
        raise LabError(f"traffic: {addr} is outside the lab subnet {SUBNET}.0/24; refusing to send")
    payload = b"\0" * CHUNK
    socks = []
    for _ in range(streams):
        s = socket.create_connection((addr, port), timeout=10)
        socks.append(s)
    per_stream = max_bytes // streams
    t0 = time.monotonic()
    periods: list[list[int]] = []

    def pump(s: socket.socket, until: float, budget: list[int]) -> None:
        while time.monotonic() < until and budget[0] > 0:
            try:
                n = s.send(payload)
            except OSError:
                return
            budget[0] -= n

    budgets = [[per_stream] for _ in socks]
    while time.monotonic() - t0 < duration and any(b[0] > 0 for b in budgets):
        start = time.monotonic()
        until = min(t0 + duration, start + (on_s if off_s > 0 else duration))
        periods.append([time.monotonic_ns(), 0])
        ths = [threading.Thread(target=pump, args=(s, until, b), daemon=True)
               for s, b in zip(socks, budgets, strict=True)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        periods[-1][1] = time.monotonic_ns()
        if log:  # written after every burst so a killed sender still leaves its on-periods behind
            with open(log, "w") as fh:
                json.dump({"on_periods_monotonic_ns": periods}, fh)
        if off_s > 0:
            time.sleep(max(0.0, min(off_s, t0 + duration - time.monotonic())))
    for s in socks:
        s.close()
    return {"on_periods_monotonic_ns": periods}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m fabricpace.lab.traffic")
    p.add_argument("role", choices=("recv", "send"))
    p.add_argument("--addr", default="")
    p.add_argument("--port", type=int, default=MEASURE_PORT)
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--max-bytes", type=int, default=256 * 1024**2)
    p.add_argument("--streams", type=int, default=1)
    p.add_argument("--on", type=float, default=0.0, help="send in bursts of ON seconds ...")
    p.add_argument("--off", type=float, default=0.0, help="... separated by OFF seconds of silence")
    p.add_argument("--log", default=None)
    a = p.parse_args(argv)
    if a.duration <= 0 or a.duration > 3600:
        p.error("--duration must be in (0, 3600] seconds")
    if a.role == "recv":
        out = _recv(a.port, a.duration, a.max_bytes, a.streams)
    else:
        out = _send(a.addr, a.port, a.duration, a.max_bytes, a.streams, a.on, a.off, a.log)
    print(json.dumps(out), flush=True)


# ---------------------------------------------------------------------------------------------- launcher
def spawn_in_ns(cfg: LabConfig, ns: str, args: list[str], what: str) -> subprocess.Popen[str]:
    """Start ``python -m fabricpace.lab.traffic ARGS`` inside namespace ``ns``; its PID is recorded."""
    cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "fabricpace.lab.traffic", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    state.record_pid(cfg.prefix, proc.pid, what)  # `ip netns exec` execs python: same PID
    return proc


@dataclass(frozen=True)
class Measurement:
    """One bounded TCP transfer: goodput over the steady part (after the first 20% of the time)."""

    bytes: int
    seconds: float
    goodput_bps: float
    set_rate_bps: int

    @property
    def ratio(self) -> float:
        return self.goodput_bps / self.set_rate_bps


def measure(cfg: LabConfig, src_ns: str, dst_ns: str, dst_addr: str, *, seconds: float = 2.0,
            set_rate_bps: int | None = None) -> Measurement:
    """Measure TCP goodput from ``src_ns`` to ``dst_addr`` (in ``dst_ns``) for ``seconds``."""
    rate = set_rate_bps or cfg.uplink_bps
    cap = int(rate / 8 * seconds * 2) + CHUNK  # never more than twice what the set rate allows
    recv = spawn_in_ns(cfg, dst_ns, ["recv", "--port", str(MEASURE_PORT), "--duration", str(seconds),
                                     "--max-bytes", str(cap)], "measure-recv")
    send: subprocess.Popen[str] | None = None
    try:
        assert recv.stdout is not None
        if recv.stdout.readline().strip() != "listening":
            why = recv.stderr.read() if recv.stderr else ""
            raise LabError(f"traffic receiver in {dst_ns} did not start: {why.strip()[-200:]}")
        send = spawn_in_ns(cfg, src_ns, ["send", "--addr", dst_addr, "--port", str(MEASURE_PORT),
                                         "--duration", str(seconds), "--max-bytes", str(cap)], "measure-send")
        _out, err = send.communicate(timeout=seconds + 30)
        if send.returncode != 0:
            raise LabError(f"traffic sender in {src_ns} failed: {err.strip().splitlines()[-1:]}")
        out, err = recv.communicate(timeout=seconds + 30)
    finally:
        for proc in (recv, send):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        state.forget_pids(cfg.prefix, [p.pid for p in (recv, send) if p is not None])
    res = json.loads(out.strip().splitlines()[-1])
    samples = res["samples"]
    if len(samples) < 4:
        raise LabError(f"uplink measurement got too few samples ({len(samples)}); is the lab up?")
    # Skip slow start and the shaper's initial burst: rate over the last 80% of the transfer.
    t_end, b_end = samples[-1]
    t_skip = 0.2 * t_end
    t0, b0 = next((t, b) for t, b in samples if t >= t_skip)
    goodput = (b_end - b0) * 8 / max(t_end - t0, 1e-6)
    return Measurement(bytes=int(res["bytes"]), seconds=float(t_end), goodput_bps=goodput, set_rate_bps=rate)


def measure_uplink(cfg: LabConfig, *, seconds: float = 2.0) -> Measurement:
    """Goodput across the spine: first node of leaf 0 to the last node (on the last leaf)."""
    if cfg.leaves < 2:
        raise LabError("measuring the uplink needs at least 2 leaves")
    from fabricpace.lab.fabric import read_rate

    last = cfg.nodes - 1
    # "set" is what tc has now on the path's two uplink ends (leaf 0 -> spine, spine -> last leaf), not
    # the lab's config: a drifted uplink (10mbit by hand, a killed run's change) showed "set 50 Mbit/s,
    # measured 9.6 (19%)" and hid the cause.
    read = [read_rate(cfg.switch_ns, cfg.uplink_leaf_end(0)),
            read_rate(cfg.switch_ns, cfg.uplink_spine_end(cfg.leaf_of(last)))]
    have = [r for r in read if r]
    return measure(cfg, cfg.node_ns(0), cfg.node_ns(last), cfg.node_addr(last), seconds=seconds,
                   set_rate_bps=min(have) if have else None)


if __name__ == "__main__":
    main()
