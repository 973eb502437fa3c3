"""Cluster files: presets, validation errors that name file and field, round trip, leaf_of."""

from __future__ import annotations

import pytest

import fabricpace
from fabricpace._errors import ConfigError
from fabricpace.fabric import load_cluster, preset_names, save_cluster


def test_presets_load_and_are_frozen():
    assert set(preset_names()) >= {"dgx-h100-ib", "p5-efa", "roce-leaf-spine-2to1", "single-switch"}
    for name in preset_names():
        cl = load_cluster(name)
        assert cl.name == name and cl.nodes >= 16 and cl.gpus_per_node == 8
        with pytest.raises(Exception):  # noqa: B017 - pydantic raises ValidationError on frozen models
            cl.nodes = 3  # type: ignore[misc]
    assert fabricpace.load_cluster is load_cluster


def test_leaf_of():
    assert load_cluster("single-switch").leaf_of(31) == 0
    roce = load_cluster("roce-leaf-spine-2to1")
    assert [roce.leaf_of(n) for n in (0, 15, 16, 511)] == [0, 0, 1, 31]
    with pytest.raises(ConfigError):
        roce.leaf_of(512)


def test_bad_field_names_file_and_field(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: x\nnodes: 4\nnetwork:\n  spines: -1\n")
    with pytest.raises(
        ConfigError, match=r"c\.yaml: field network\.spines: Input should be greater than or equal to 1"
    ):
        load_cluster(p)
    p.write_text("name: x\nnodes: 4\nnics:\n  speed_gbsp: 400\n")
    with pytest.raises(ConfigError, match=r"field nics\.speed_gbsp: Extra inputs are not permitted"):
        load_cluster(p)
    p.write_text("name: x\nnodes: [4\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:\d+: .*fix the YAML syntax"):
        load_cluster(p)
    with pytest.raises(ConfigError, match="no such file or preset"):
        load_cluster("no-such-preset")


def test_round_trip(tmp_path):
    cl = load_cluster("p5-efa").with_tuning(net_efficiency=0.5, source="test")
    out = save_cluster(cl, tmp_path / "p5.yaml")
    assert load_cluster(out) == cl
