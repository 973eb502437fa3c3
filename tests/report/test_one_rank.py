"""A one-rank run with collectives (benchmarks/gpu_check.py's nccl1 item: one GPU, one rank) gets a
report: its instances have no peer, so no rank waits for another (the report crashed on that with
"cannot concat empty list" after 31d4809)."""

from __future__ import annotations

import fabricpace


def test_report_of_a_one_rank_run_with_collectives(cli, tmp_path):
    run = tmp_path / "one"
    obs = fabricpace.observe(None, run)
    for _ in range(30):
        with obs.step(samples=4), obs.collective("all_reduce", 1 << 20):
            pass
    obs.close()
    out = tmp_path / "one.html"
    r = cli("report", str(run), "--out", str(out))
    assert r.returncode == 0, r.stderr[-1500:]
    assert out.stat().st_size > 0
