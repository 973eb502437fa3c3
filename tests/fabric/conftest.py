"""Fabric test fixtures: the validation logs and small clusters built in code."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricpace.fabric import Cluster

DATA = Path(__file__).parent / "data"


@pytest.fixture
def data_dir() -> Path:
    return DATA


def make_cluster(**overrides) -> Cluster:
    """A cluster from a plain dict (validated like a YAML file)."""
    base = {
        "name": "test",
        "nodes": 64,
        "gpus_per_node": 8,
        "intra_node": {"kind": "nvswitch", "bandwidth_gbytes": 450, "latency_us": 0.5},
        "nics": {"per": "gpu", "count": 8, "speed_gbps": 100},
        "network": {
            "topology": "single_switch",
            "routing": "ecmp",
            "hop_latency_us": 0.5,
            "nic_latency_us": 2.0,
        },
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return Cluster.model_validate(base)


@pytest.fixture
def cluster_factory():
    return make_cluster
