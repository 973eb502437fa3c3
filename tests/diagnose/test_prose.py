"""Ids in prose: findings and recommendations name ranks/nodes/stages in words, not Python lists."""

from __future__ import annotations


def test_prose_lists_of_ids():
    from fabricpace.diagnose.stats import named, prose_list

    assert named("rank", [3]) == "rank 3"
    assert named("rank", [3, 5]) == "ranks 3 and 5"
    assert named("rank", [3, 5, 7]) == "ranks 3, 5 and 7"
    assert named("node", list(range(10)), limit=4) == "nodes 0, 1, 2, 3 and 6 more"
    assert named("leaf", [0, 1]) == "leaves 0 and 1" and named("gpu", ["0:GPU1"]) == "GPU 0:GPU1"
    assert prose_list([]) == ""
