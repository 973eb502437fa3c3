"""Reader for the JSON file nccl-tests writes with ``-J FILE.json`` (``--output_file``; nccl-tests 2.17+).

The layout is the one ``src/util.cu`` of NVIDIA/nccl-tests writes (``JSON_FILE_VERSION 2``): a top-level
object with ``args`` (the command line, so the ``*_perf`` binary names the op), ``config`` (with ``devices``:
one object per rank, ``rank group pid hostname device device_hex device_info``), ``results`` (one object
per row: ``size count type redop root`` and ``out_of_place`` / ``in_place`` objects holding ``time`` or
``cpu_time``, ``alg_bw``, ``bus_bw``, ``nwrong``; ``out_of_place`` is ``null`` where a fork measured
in-place only) and ``average_bus_bandwidth.bandwidth``. nccl-tests prints doubles with ``%lf``, so an
infinite time is the bare word ``inf`` (not JSON): it is read as a row without a measured time, as in the
text log. The result is the same ``NcclTestsLog`` the text parser returns, so calibration, ``--compare``
and ``import`` take either file.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from fabricpace._errors import ParseError
from fabricpace.fabric.nccl_tests import (
    NcclTestsLog,
    NcclTestsRow,
    _check_even,
    _nodes_from_name,
    _one_sweep,
    _op_from,
    _op_from_name,
)

# %lf of an infinite double: "inf" / "-inf" where a JSON value belongs
_BARE_INF = re.compile(r"(?<=[:\[,])(\s*)(-?inf)(?=\s*[,\]}])")


def _number(v: Any) -> float:
    if isinstance(v, bool) or v is None:
        return math.nan
    if isinstance(v, int | float):
        return float(v)
    try:
        return float(str(v))  # "nan", "inf" (strings nccl-tests writes for NaN; the bare inf made a string)
    except ValueError:
        return math.nan


def _block(row: dict[str, Any], key: str) -> tuple[float, float, float] | None:
    b = row.get(key)
    if not isinstance(b, dict):
        return None
    t = b.get("time", b.get("cpu_time"))
    return _number(t), _number(b.get("alg_bw")), _number(b.get("bus_bw"))


def _nwrong(row: dict[str, Any], key: str) -> int:
    """A block's ``nwrong`` (values found wrong); 0 when absent, null or not a positive number (-c 0)."""
    b = row.get(key)
    v = _number(b.get("nwrong")) if isinstance(b, dict) else math.nan
    return int(v) if math.isfinite(v) and v > 0 else 0


def rccl_tests_output(p: Path) -> ParseError:
    """The refusal for rccl-tests' ``-x FILE -Z json|csv`` output: one record per size and in/out-of-place
    (``name nodes ranks ranksPerNode gpusPerRank size type redop inPlace time algBw busBw wrong``;
    ROCm/rccl-tests ``Reporter::addResult`` in ``src/common.cu``). It names no host, and its ``nodes`` is
    totalProcs / nProcs (communicators, 1 without NCCL_TESTS_SPLIT_MASK), not the node count; its ``size`` is
    the received bytes, which for reduce_scatter is not the size the stdout log prints."""
    return ParseError(
        f"{p}: an rccl-tests -x/-Z output file; it names no host and its 'nodes' field counts communicators, "
        "so the node count is unknown: give the run's stdout log (the table with its '#  Rank' lines)"
    )


def parse_json(p: Path, text: str, *, op: str | None, nodes: int | None) -> NcclTestsLog:
    """An nccl-tests ``-J`` JSON file as an ``NcclTestsLog``; ParseError naming the file and what to fix."""
    first = text.lstrip().split("\n", 1)[0]
    if '"inPlace"' in first and '"busBw"' in first:  # one record per line: rccl-tests -Z json
        raise rccl_tests_output(p)
    try:
        doc = json.loads(_BARE_INF.sub(r'\1"\2"', text))
    except json.JSONDecodeError as exc:
        raise ParseError(
            f"{p}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg}); nccl-tests closes its -J file only "
            "when the run ends, so a killed run leaves it cut off: give the run's stdout log instead"
        ) from exc
    results = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(results, list):
        raise ParseError(
            f"{p}: a JSON file without a 'results' list, so not an nccl-tests -J file; give the nccl-tests "
            "stdout log or the file its -J option wrote"
        )
    args = doc.get("args") if isinstance(doc.get("args"), list) else []
    found_op = op or _op_from(" ".join(str(a) for a in args))
    if found_op is None:
        found_op = _op_from_name(p.name)
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    devices = config.get("devices", doc.get("devices")) or []
    ranks: dict[int, tuple[str, int]] = {}
    groups: set[int] = set()
    for d in devices if isinstance(devices, list) else []:
        if isinstance(d, dict) and isinstance(d.get("rank"), int):
            ranks[d["rank"]] = (str(d.get("hostname", "")), int(d.get("device", 0)))
            groups.add(int(d.get("group", 0) or 0))
    if len(groups) > 1:
        raise ParseError(
            f"{p}: ranks are split into {len(groups)} groups (NCCL_TESTS_SPLIT_MASK): each row times one "
            "group's communicator, not all ranks; rerun without NCCL_TESTS_SPLIT_MASK"
        )
    rows: list[NcclTestsRow] = []
    dropped = inplace_only = 0
    for i, r in enumerate(results):
        if not isinstance(r, dict):
            raise ParseError(f"{p}: results[{i}] is not an object; give the file nccl-tests wrote")
        inp = _block(r, "in_place")
        out = _block(r, "out_of_place")
        if inp is None and out is None:
            raise ParseError(f"{p}: results[{i}] has neither 'out_of_place' nor 'in_place' numbers")
        if out is None:
            inplace_only += 1
        out = out or inp
        inp = inp or out
        assert out is not None and inp is not None
        try:
            size, count = int(r["size"]), int(r.get("count", 0))
            root = int(str(r.get("root", "-1")).strip() or -1)
        except (KeyError, TypeError, ValueError) as exc:
            raise ParseError(f"{p}: results[{i}]: no integer 'size' (or a bad 'count'/'root')") from exc
        wrong = sum(_nwrong(r, k) for k in ("out_of_place", "in_place"))
        row = NcclTestsRow(
            size=size, count=count, type=str(r.get("type", "")), redop=str(r.get("redop") or "none").strip()
            or "none", root=root, time_us=out[0], algbw=out[1], busbw=out[2], inplace_time_us=inp[0],
            inplace_algbw=inp[1], inplace_busbw=inp[2], wrong=wrong,
        )  # fmt: skip
        if math.isfinite(row.time_us) and row.time_us > 0:
            rows.append(row)
        else:
            dropped += 1
    if not rows:
        raise ParseError(
            f"{p}: no result with a measured time in 'results' ({len(results)} entries); give the file of a "
            "run that completed"
        )
    rows, others = _one_sweep(rows)
    hosts = tuple(sorted({h for h, _ in ranks.values()}))
    nranks = (max(ranks) + 1) if ranks else None
    if nodes is None and nranks is not None and len(ranks) == nranks:
        _check_even(p, ranks, dict.fromkeys(ranks, 1))
    n_nodes = nodes if nodes is not None else (len(hosts) or _nodes_from_name(p.name))
    gpn = nranks // n_nodes if nranks and n_nodes and nranks % n_nodes == 0 else None
    oob = doc.get("out_of_bounds")
    oob_count = _number(oob.get("count")) if isinstance(oob, dict) else math.nan
    avg = doc.get("average_bus_bandwidth")
    avg_bw = _number(avg.get("bandwidth")) if isinstance(avg, dict) else math.nan
    return NcclTestsLog(
        path=str(p),
        op=found_op,
        nranks=nranks,
        nodes=n_nodes,
        hosts=hosts,
        rows=tuple(rows),
        avg_busbw=avg_bw if math.isfinite(avg_bw) else None,
        gpus_per_node=gpn,
        dropped_rows=dropped,
        other_sweeps=others,
        inplace_only_rows=inplace_only,
        out_of_bounds=int(oob_count) if math.isfinite(oob_count) and oob_count >= 0 else None,
    )
