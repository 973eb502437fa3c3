"""gloo collectives' bytes from the recorded tensor shapes of real torch.profiler traces.

data/real_gloo was profiled with record_shapes=True: each ``gloo:all_reduce`` span carries its input,
the flattened DDP bucket (``'Input Dims': [[68362]], 'Input type': ['float']``; the model's 68,362
parameters), while the issuing ``c10d::allreduce_`` only says ``TensorList``. data/real_gloo_repeat was
profiled without shapes (data/make_real_gloo_traces.py): bytes stay unknown there.
"""

from __future__ import annotations

from pathlib import Path

from fabricpace.importers.kineto import import_kineto
from fabricpace.run import load_run

DATA = Path(__file__).parent / "data"


def test_gloo_bytes_from_recorded_shapes(tmp_path: Path) -> None:
    c = load_run(import_kineto(DATA / "real_gloo", tmp_path / "run")).collectives
    assert c.height == 12
    assert c["bytes"].null_count() == 0
    assert set(c["bytes"].to_list()) == {68362 * 4}


def test_gloo_bytes_unknown_without_shapes(tmp_path: Path) -> None:
    c = load_run(import_kineto(DATA / "real_gloo_repeat", tmp_path / "run")).collectives
    assert c.height == 12 and c["bytes"].null_count() == 12
