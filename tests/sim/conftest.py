"""Fixtures for simulator tests: small workload/noise/cluster files written to tmp_path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml


def _write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def write_yaml():
    """write_yaml(path, mapping) -> path."""
    return _write_yaml


@pytest.fixture
def small_workload(tmp_path: Path) -> Path:
    """A 4-bucket DDP workload: 100 ms compute, 10 ms optimizer (times easy to check by hand)."""
    return _write_yaml(
        tmp_path / "small.yaml",
        {
            "name": "small",
            "parameters": 2.0e7,  # 80 MB of fp32 gradients: buckets 1 MiB, 3 x 25 MiB, rest
            "layers": 8,
            "grad_bytes": 4,
            "batch_per_gpu": 16,
            "compute": {"seconds": 0.1},
            "optimizer_seconds": 0.01,
        },
    )


@pytest.fixture
def leaf_cluster(tmp_path: Path) -> Path:
    """Leaf-spine with 2 nodes per leaf and 2 spines (short link names to fault)."""
    return _write_yaml(
        tmp_path / "leafy.yaml",
        {
            "name": "leafy",
            "nodes": 8,
            "gpus_per_node": 2,
            "nics": {"per": "gpu", "count": 2, "speed_gbps": 100},
            "network": {"topology": "leaf_spine", "nodes_per_leaf": 2, "spines": 2, "oversubscription": 1.0},
        },
    )
