"""The comm policy on real gloo ranks: it is tried only where it can act (audit 15, finding 2).

Before: a job with ``pacing="auto"`` on one host whose transfer swung with CPU scheduling started a
comm trial ("transfer 5.29x its quiet level"), also on a model with one DDP bucket (a window of 2
cannot hold anything there); the observer installed its Python comm hook for the trial, the guard
reverted comm, and the hook stayed for the rest of the run: +5-8% overhead at 1 ms steps became
+18-31%. The jobs here make the comm trigger fire (``_comm_worker.py``: window summaries report
transfer inflated 3x, gating costs 30%), and check what the observer and the pacer do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fabricpace

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
WORLD = 2


def _job(launch, out: Path, *, local_world: int, **cfg):  # type: ignore[no-untyped-def]
    cfg = {"window": 5, **cfg}
    procs = launch(HERE / "_comm_worker.py", [str(out), json.dumps(cfg)], world=WORLD,
                   local_world=local_world)
    for rank, p in enumerate(procs):
        assert p.returncode == 0, f"rank {rank} failed:\n{p.stderr[-4000:]}"
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(WORLD)]


def test_comm_is_not_tried_on_a_model_with_one_bucket(launch, tmp_path):
    # Before: "limiting in-flight buckets to 2 (on trial)" at step 34 and the comm hook installed.
    results = _job(launch, tmp_path, local_world=1, model="one", steps=45)
    for r in results:
        assert [d for d in r["decisions"] if d[1] == "comm"] == []
        assert r["buckets"] == 1
        assert "comm" in r["policies"]  # (left in: it only cannot act on this model)
        assert set(r["modes"]) == {"grad_hooks"} and r["equal"] == [True] * 45


def test_auto_leaves_comm_out_when_all_ranks_share_one_host(launch, tmp_path):
    # torchrun on one host (LOCAL_WORLD_SIZE = WORLD_SIZE). Before: the trial and the hook at step 34.
    results = _job(launch, tmp_path, local_world=WORLD, model="four", steps=45)
    for r in results:
        assert "comm" not in r["policies"] and r["buckets"] == 4
        assert [d for d in r["decisions"] if d[1] == "comm"] == []
        assert set(r["modes"]) == {"grad_hooks"}
    notes = fabricpace.load_run(tmp_path / "run").manifest.extra["pacing_notes"]
    assert any("comm left out: all 2 ranks run on one host" in n for n in notes), notes
