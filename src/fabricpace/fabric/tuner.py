"""Algorithm/protocol choice of a tuner plugin that replaces NCCL's own cost model.

AWS's NCCL plugin (aws-ofi-nccl) ships a "region" tuner: for a platform it lists polygons in the plane
(log2 message size, log2 rank count), each with the (algorithm, protocol) to use inside it; the first
polygon that holds the point wins (its edges count as inside), and a point outside every polygon falls
back to NCCL's own choice. ``tuning.tuner: aws-ofi-p5`` in a cluster file makes the model choose the same
way, so that predictions for a p5 cluster run with that plugin (``NCCL_TUNER_PLUGIN=libnccl-ofi-tuner.so``)
pick the algorithm the real run picks; the time of that choice still comes from the fabric model.

The vertices below are the published constants of aws-ofi-nccl, ``src/tuner/nccl_ofi_regions.cpp``
(``region_init_internal_p5_p5e``, the 8-ranks-per-node all-reduce table; stored version at commit
228fa0eafb41c9e2b46446b86b5ab46c76410650). That version has no all-gather or reduce-scatter table for
p5 with 8 GPUs per node, so those collectives keep NCCL's choice. Only the numbers are used; the geometry
(line extension, point in polygon with an edge tolerance) is written here.
"""

from __future__ import annotations

import functools
import math

TUNERS = ("nccl", "aws-ofi-p5")

_MAX_SIZE = 100.0 * 1024**3  # the plugin's TUNER_MAX_SIZE and TUNER_MAX_RANKS (outer corner of the plane)
_MAX_RANKS = 1024.0 * 1024.0
_EPS = 1e-10

Point = tuple[float, float]  # (log2 bytes, log2 ranks)


def _log(p: tuple[float, float]) -> Point:
    # a vertex at 0 bytes is the left border of the plane: one byte is below any message the model sees
    return math.log2(max(p[0], 1.0)), math.log2(max(p[1], 1.0))


def _extend(a: tuple[float, float], b: tuple[float, float]) -> Point:
    """Continue the line a->b (log-log) until it meets the plane's outer border (max size or max ranks)."""
    (ax, ay), (bx, by) = _log(a), _log(b)
    zx, zy = _log((_MAX_SIZE, _MAX_RANKS))
    if ax == bx:
        return ax, zy
    if ay == by:
        return zx, ay
    slope = (ay - by) / (ax - bx)
    y_at_border = by + slope * (zx - bx)
    if y_at_border < zy:
        return zx, y_at_border
    return bx + (zy - by) / slope, zy


def _on_segment(p: Point, a: Point, b: Point) -> bool:
    """True when ``p`` lies on segment a-b (within _EPS in log2 units)."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    length2 = dx * dx + dy * dy
    if length2 == 0.0:
        return math.hypot(p[0] - a[0], p[1] - a[1]) < _EPS
    t = ((p[0] - a[0]) * dx + (p[1] - a[1]) * dy) / length2
    if t < -_EPS or t > 1 + _EPS:
        return False
    return math.hypot(p[0] - (a[0] + t * dx), p[1] - (a[1] + t * dy)) < _EPS


def inside(p: Point, polygon: tuple[Point, ...]) -> bool:
    """Point in polygon (even-odd ray casting); a point on an edge is inside, as in the plugin."""
    n = len(polygon)
    if any(_on_segment(p, polygon[i], polygon[(i + 1) % n]) for i in range(n)):
        return True
    x, y = p
    crossings = 0
    for i in range(n):
        (x1, y1), (x2, y2) = polygon[i], polygon[(i + 1) % n]
        if (y1 > y) != (y2 > y) and x < x1 + (y - y1) * (x2 - x1) / (y2 - y1):
            crossings += 1
    return crossings % 2 == 1


@functools.cache
def _p5_all_reduce() -> tuple[tuple[str, str, tuple[Point, ...]], ...]:
    """(algorithm, protocol, polygon) in the plugin's order: p5/p5e, 8 ranks per node, all-reduce."""
    tree_ll128 = _extend((402653184, 2048), (402653184, 4096))
    nvlstree_1 = _extend((8053063680, 160), (9663676416, 192))
    nvlstree_2 = _extend((402653184, 2048), (402653184, 4096))
    ring_simple = _extend((8053063680, 160), (9663676416, 192))
    lg = _log
    return (
        (
            "tree",
            "LL128",
            tuple(
                [lg(v) for v in ((0, 16), (31457280, 16), (37748736, 32), (117440512, 64), (301989888, 128))]
                + [lg(v) for v in ((301989888, 256), (335544320, 512), (536870912, 1024), (402653184, 2048))]
                + [lg((402653184, 4096)), tree_ll128, (lg((1, 1))[0], tree_ll128[1])]
            ),
        ),
        ("nvls_tree", "Simple", tuple(lg(v) for v in ((31457281, 16), (_MAX_SIZE, 16), (31457281, 16)))),
        (
            "ring",
            "LL128",
            tuple(
                lg(v)
                for v in (
                    (31457280, 17),
                    (1073741824, 17),
                    (2147483648, 64),
                    (2147483648, 128),
                    (1342177280, 160),
                    (2147483648, 256),
                    (1074790400, 256),
                    (444596224, 160),
                    (301989888, 128),
                    (117440512, 64),
                    (37748736, 32),
                )
            ),
        ),
        (
            "nvls_tree",
            "Simple",
            tuple(
                [lg(v) for v in ((2147483648, 128), (6442450944, 128), (8053063680, 160), (9663676416, 192))]
                + [nvlstree_1, nvlstree_2]
                + [
                    lg(v)
                    for v in (
                        (402653184, 4096),
                        (402653184, 2048),
                        (536870912, 1024),
                        (335544320, 512),
                        (301989888, 256),
                        (310378496, 160),
                        (444596224, 160),
                        (1074790400, 256),
                        (2684354560, 256),
                        (2147483648, 224),
                        (1342177280, 160),
                    )
                ]
            ),
        ),
        (
            "ring",
            "Simple",
            tuple(
                [lg((1073741824, 17)), (ring_simple[0], lg((1, 17))[1]), ring_simple]
                + [lg(v) for v in ((9663676416, 192), (8053063680, 160), (2684354560, 64), (1610612736, 32))]
            ),
        ),
    )


def tuner_choice(
    tuner: str, op: str, nbytes: float, nodes: int, gpus_per_node: int, *, nvls: bool
) -> tuple[str, str] | None:
    """(algorithm, protocol) the tuner picks, or None where it leaves the choice to NCCL. Like the plugin,
    it skips NVLS-tree regions when NVLink SHARP is not available, and since aws-ofi-nccl PR #778/#779
    (February 2025, in the v1.16.3 the measured p5 run used) it makes no choice on 2 nodes or fewer."""
    if tuner != "aws-ofi-p5" or op != "all_reduce" or gpus_per_node != 8 or nbytes <= 0 or nodes <= 2:
        return None
    p = _log((float(nbytes), float(nodes * gpus_per_node)))
    for algorithm, protocol, polygon in _p5_all_reduce():
        if (nvls or algorithm != "nvls_tree") and inside(p, polygon):
            return algorithm, protocol
    return None
