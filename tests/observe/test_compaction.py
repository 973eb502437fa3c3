"""A real observed job (one-rank gloo DDP) whose parts are merged as it runs (ObserverConfig.compact_parts):
the run reads the same rows as one that keeps every part, and its coverage finds nothing lost."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import fabricpace  # noqa: E402
from fabricpace.observe import ObserverConfig, observe  # noqa: E402
from fabricpace.run.reader import run_coverage  # noqa: E402

STEPS = 30


def _job(run_dir, compact: int):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.001)
    # a part after every step, merged every 4 parts
    cfg = ObserverConfig(status_line=False, flush_mode="main", flush_every=1, flush_interval_s=0,
                         window=10, compact_parts=compact)
    x = torch.randn(8, 16)
    with observe(model, run_dir, config=cfg) as obs:
        for _ in range(STEPS):
            with obs.step(samples=8):
                model.zero_grad()
                model(x).sum().backward()
    assert obs.failures == {}
    return fabricpace.load_run(run_dir)


def test_merged_parts_hold_every_row_once(gloo_world1, tmp_path):
    merged = _job(tmp_path / "merged", 4)
    plain = _job(tmp_path / "plain", 0)
    for table in ("steps", "collectives"):
        names = sorted(p.name for p in (tmp_path / "merged" / table / "rank-00000").iterdir())
        n = len(list((tmp_path / "plain" / table / "rank-00000").iterdir()))
        assert n >= STEPS - 5  # about a part per step (the first and the last may hold more)
        ranges = [f"part-{a:06d}-{a + 3:06d}.parquet" for a in range(0, n - n % 4, 4)]
        singles = [f"part-{i:06d}.parquet" for i in range(n - n % 4, n)]
        assert len(ranges) >= 6 and names == sorted(ranges + singles)
    assert merged.steps["step"].to_list() == plain.steps["step"].to_list() == list(range(STEPS))
    assert merged.collectives.height == plain.collectives.height >= STEPS - 5
    assert merged.collectives["step"].to_list() == plain.collectives["step"].to_list()
    assert merged.collectives["seq"].to_list() == plain.collectives["seq"].to_list()
    cov = run_coverage(tmp_path / "merged")
    assert cov.excluded == [] and not any("lost" in w for w in cov.warnings)
