"""Streaming parser of one PyTorch-profiler (Kineto) trace file: bounded memory at any file size.

The ``traceEvents`` array is parsed event by event with ijson's C backend (an incremental tokenizer);
per kept event only a name id and two floats are stored, in compact arrays. Keys before the array
(``distributedInfo``) are read from the file's head, keys after it (``baseTimeNanoseconds``) from a tail
buffer kept while streaming. ``fabricpace.importers.kineto`` turns the result into run-directory tables.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import ijson
import numpy as np

from fabricpace._errors import ParseError

SUFFIXES = (".json", ".json.gz")
_TAIL_BYTES = 1 << 16
_HEAD_BYTES = 1 << 22

# Element sizes of the dtype names PyTorch writes into the NCCL metadata (c10 ScalarType names).
DTYPE_BYTES = {
    "float": 4, "float32": 4, "half": 2, "float16": 2, "bfloat16": 2, "double": 8, "float64": 8,
    "int": 4, "int32": 4, "long": 8, "int64": 8, "short": 2, "int16": 2, "char": 1, "int8": 1,
    "byte": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1, "complexfloat": 8, "complexdouble": 16,
}

# Canonical op names, looked up on a lower-case name with '_' removed (first match wins).
_OP_WORDS = (
    ("reducescatter", "reduce_scatter"),
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("alltoall", "all_to_all"),
    ("sendrecv", "send_recv"),
    ("broadcast", "broadcast"),
    ("barrier", "barrier"),
    ("reduce", "reduce"),
    ("gather", "gather"),
    ("scatter", "scatter"),
    ("send", "send_recv"),
    ("recv", "send_recv"),
)

# CPU communication op kinds, in order of preference (the first kind present is used).
_CPU_KINDS = ("record_param_comms", "c10d::", "nccl:", "gloo:")
_CPU_CATS = frozenset({"cpu_op", "user_annotation", "python_function"})
_GPU_OP_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# First characters of the CPU event names kept (ProfilerStep#, record_param_comms, c10d::, nccl:, gloo:,
# enumerate(DataLoader)); everything else on the CPU side is dismissed by this one test.
_CPU_FIRST = frozenset("Prcnge")


def canonical_op(name: str) -> str:
    """'ncclDevKernel_AllReduce_Sum_bf16_RING_LL' / 'c10d::allreduce_' / 'allgather' -> canonical name."""
    key = name.lower().replace("_", "")
    for prefix in ("ncclkernel", "nccldevkernel", "rcclkernel", "c10d::", "nccl:", "gloo:"):
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    for word, op in _OP_WORDS:
        if word in key:
            return op
    return "other"


def is_comm_kernel(name: str) -> bool:
    low = name[:16].lower()
    return low.startswith(("nccl", "rccl")) and "kernel" in name[:24].lower()


@dataclass
class _Cols:
    """Compact growable columns (8 bytes a value) for one kind of kept event."""

    ts: array = field(default_factory=lambda: array("d"))
    dur: array = field(default_factory=lambda: array("d"))
    name: array = field(default_factory=lambda: array("l"))

    def add(self, ts: float, dur: float, name: int) -> None:
        self.ts.append(ts)
        self.dur.append(dur)
        self.name.append(name)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (np.frombuffer(self.ts, dtype=np.float64), np.frombuffer(self.dur, dtype=np.float64),
                np.frombuffer(self.name, dtype=np.int64))


@dataclass
class RankTrace:
    """What one rank's trace contributes, in µs relative to its base time (floats) until finalized."""

    path: Path
    rank: int | None
    world_size: int | None
    host: str | None
    base_ns: int = 0
    names: dict[str, int] = field(default_factory=dict)
    cpu_steps: _Cols = field(default_factory=_Cols)
    gpu_steps: _Cols = field(default_factory=_Cols)
    kernels: _Cols = field(default_factory=_Cols)  # non-communication GPU work
    comm_kernels: _Cols = field(default_factory=_Cols)
    comm_bytes: array = field(default_factory=lambda: array("q"))
    comm_group: array = field(default_factory=lambda: array("l"))
    cpu_comm: dict[str, _Cols] = field(default_factory=lambda: {k: _Cols() for k in _CPU_KINDS})
    cpu_comm_bytes: dict[str, array] = field(default_factory=lambda: {k: array("q") for k in _CPU_KINDS})
    cpu_comm_group: dict[str, array] = field(default_factory=lambda: {k: array("l") for k in _CPU_KINDS})
    data: _Cols = field(default_factory=_Cols)
    events: int = 0
    pid: int | None = None  # process id of the ProfilerStep events: tells one process's cycles apart

    def name_id(self, name: str) -> int:
        i = self.names.get(name)
        if i is None:
            i = self.names[name] = len(self.names)
        return i


class _CountingReader:
    """A binary reader that counts bytes, reports progress and keeps the last bytes read (the tail)."""

    def __init__(self, raw: IO[bytes], progress: Callable[[int], None] | None) -> None:
        self.raw = raw
        self.progress = progress
        self.offset = 0
        self.tail = b""

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.offset += len(data)
        self.tail = (self.tail + data)[-_TAIL_BYTES:] if len(data) < _TAIL_BYTES else data[-_TAIL_BYTES:]
        if self.progress is not None and data:
            self.progress(len(data))
        return data


def _open(path: Path) -> IO[bytes]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return path.open("rb")


def _read_head(path: Path) -> dict[str, Any]:
    """Top-level keys that come before ``traceEvents`` (schemaVersion, distributedInfo, ...).

    Reads 64 KiB at a time until the ``traceEvents`` key is reached (a few KiB in real traces).
    """
    text = ""
    try:
        with _open(path) as fh:
            while True:
                chunk = fh.read(1 << 16)
                text += chunk.decode("utf-8", errors="replace")
                head = _parse_head(path, text, final=not chunk or len(text) >= _HEAD_BYTES)
                if head is not None:
                    return head
    except (OSError, EOFError, zlib.error) as exc:
        raise ParseError(f"{path}: cannot read ({exc}); is it a complete .json or .json.gz file?") from exc


def _parse_head(path: Path, text: str, *, final: bool) -> dict[str, Any] | None:
    """Parse the keys before traceEvents from ``text``; None when more text is needed."""
    dec = json.JSONDecoder()
    i = _skip_ws(text, 0)
    if i >= len(text):
        if final:
            raise ParseError(f"{path}: empty file; expected a Chrome trace JSON object")
        return None
    if text[i] != "{":
        raise ParseError(f"{path}: not a Chrome trace (expected a JSON object with 'traceEvents')")
    head: dict[str, Any] = {}
    i += 1
    while True:
        i = _skip_ws(text, i)
        if i < len(text) and text[i] == "}":
            break
        try:
            key, i = dec.raw_decode(text, i)
            i = _skip_ws(text, i)
            if text[i] != ":":
                raise ValueError("expected ':'")
            i = _skip_ws(text, i + 1)
            if key == "traceEvents":
                return head
            value, i = dec.raw_decode(text, i)
        except (ValueError, IndexError) as exc:
            if not final:
                return None  # the value may continue in the next chunk
            raise ParseError(
                f"{path}: invalid JSON near byte {i} before 'traceEvents' ({exc}); is the file complete?"
            ) from exc
        head[str(key)] = value
        i = _skip_ws(text, i)
        if i < len(text) and text[i] == ",":
            i += 1
    raise ParseError(f"{path}: no 'traceEvents' array; not a PyTorch profiler trace")


def _skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in " \t\r\n":
        i += 1
    return i


def _read_trailer(tail: bytes) -> dict[str, Any]:
    """Top-level keys after the ``traceEvents`` array (traceName, baseTimeNanoseconds, ...)."""
    text = tail.decode("utf-8", errors="replace")
    for m in reversed(list(re.finditer(r"\]\s*,\s*(?=\")", text))):
        try:
            value = json.loads("{" + text[m.end():])
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


_RANK_IN_NAME = re.compile(r"rank[_\-]?(\d+)", re.IGNORECASE)
_PLAIN_NUMBER = re.compile(r"^[A-Za-z_\-]*?(\d+)$")
_TB_HANDLER = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)\.\d+$")  # tensorboard_trace_handler: host_pid.ms


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json", ".pt.trace"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def rank_from_name(path: Path) -> int | None:
    """'rank3.json', 'trace_rank-03.pt.trace.json.gz', 'worker7.json' -> 3, 3, 7; else None."""
    stem = _stem(path)
    m = _RANK_IN_NAME.search(stem) or _PLAIN_NUMBER.match(stem)
    return int(m.group(1)) if m else None


def host_from_name(path: Path) -> str | None:
    m = _TB_HANDLER.match(_stem(path))
    return m.group("host") if m else None


def _comm_meta(args: Any, trace: RankTrace) -> tuple[int, int, int]:
    """(bytes or -1, group id, op-name id from 'Collective name' or -1) from NCCL metadata args."""
    if not isinstance(args, dict):
        return -1, trace.name_id("default"), -1
    group = args.get("Process Group Name") or args.get("Process Group Description") or "default"
    nbytes = -1
    size = DTYPE_BYTES.get(str(args.get("dtype", "")).lower())
    if size is not None:
        n_in, n_out = args.get("In msg nelems"), args.get("Out msg nelems")
        n = max(v for v in (n_in, n_out, 0) if isinstance(v, int | float))
        nbytes = int(n) * size if n > 0 else -1
    if nbytes < 0:
        nbytes = _shape_bytes(args)
    coll = args.get("Collective name")
    op = trace.name_id(canonical_op(str(coll))) if coll else -1
    return nbytes, trace.name_id("group:" + str(group)), op


def _shape_bytes(args: dict[str, Any]) -> int:
    """Bytes of the tensors in ``Input Dims`` × ``Input type`` (record_shapes=True), -1 if unknown.

    gloo's ``gloo:*`` spans carry no NCCL metadata but, with shapes recorded, their input tensor (the
    flattened DDP bucket: ``'Input Dims': [[68362]], 'Input type': ['float']``).
    """
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != len(types):
        return -1
    total = 0
    for d, t in zip(dims, types, strict=True):
        size = DTYPE_BYTES.get(str(t).lower())
        if size is None or not isinstance(d, list) or not d:
            continue
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d):
            continue
        total += size * int(np.prod(d, dtype=np.int64))
    return total if total > 0 else -1


def parse_trace(path: Path, *, progress: Callable[[int], None] | None = None) -> RankTrace:
    """Stream one rank's trace. ParseError (file and byte offset) on any damage."""
    head = _read_head(path)
    info = head.get("distributedInfo") if isinstance(head.get("distributedInfo"), dict) else None
    trace = RankTrace(path=path, rank=None, world_size=None, host=host_from_name(path))
    if info is not None:
        trace.rank = _int_or_none(info.get("rank"))
        trace.world_size = _int_or_none(info.get("world_size"))
    raw = _open(path)
    reader = _CountingReader(raw, progress)
    try:
        _consume(ijson.items(reader, "traceEvents.item", use_float=True), trace)
    except ijson.JSONError as exc:
        msg = str(exc).splitlines()[0]
        raise ParseError(
            f"{path}: invalid JSON near byte {reader.offset} ({msg}); the trace is damaged or truncated"
        ) from exc
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise ParseError(f"{path}: truncated or corrupt gzip ({exc}); re-copy the file") from exc
    except OSError as exc:
        raise ParseError(f"{path}: cannot read ({exc})") from exc
    finally:
        raw.close()
    trailer = _read_trailer(reader.tail)
    if info is None and isinstance(trailer.get("distributedInfo"), dict):
        trace.rank = _int_or_none(trailer["distributedInfo"].get("rank"))
        trace.world_size = _int_or_none(trailer["distributedInfo"].get("world_size"))
    host = head.get("host_name", trailer.get("host_name"))  # written by recent PyTorch versions
    if isinstance(host, str) and host:
        trace.host = host
    base = head.get("baseTimeNanoseconds", trailer.get("baseTimeNanoseconds", 0))
    trace.base_ns = int(base) if isinstance(base, int | float) else 0
    if trace.rank is None:
        trace.rank = rank_from_name(path)
    if trace.rank is None:
        raise ParseError(
            f"{path}: no distributedInfo.rank in the trace and no rank number in the file name; "
            "rename it like rank3.json"
        )
    if trace.cpu_steps.ts.buffer_info()[1] == 0:
        raise ParseError(
            f"{path}: no ProfilerStep#N events; profile with a schedule and call prof.step() every step"
        )
    return trace


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _consume(events: Any, trace: RankTrace) -> None:
    """The hot loop: one dict per event; keep only what the run directory needs.

    Ordered for speed on real traces, where most events are ``cpu_op`` aten calls, runtime launches
    and flow arrows: those are dismissed after one or two dict lookups and a first-character test.
    """
    kernels, comm, cpu_steps, gpu_steps, data = (
        trace.kernels, trace.comm_kernels, trace.cpu_steps, trace.gpu_steps, trace.data)
    n = 0
    for ev in events:
        n += 1
        try:
            cat = ev.get("cat")
            if cat in _GPU_OP_CATS:
                if ev.get("ph") != "X":
                    continue
                name = ev["name"]
                ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
                if cat == "kernel" and is_comm_kernel(name):
                    nbytes, group, op = _comm_meta(ev.get("args"), trace)
                    comm.add(ts, dur, op if op >= 0 else trace.name_id(canonical_op(name)))
                    trace.comm_bytes.append(nbytes)
                    trace.comm_group.append(group)
                else:
                    kernels.add(ts, dur, trace.name_id(name))
            elif cat in _CPU_CATS:
                name = ev["name"]
                if name[:1] not in _CPU_FIRST or ev.get("ph") != "X":
                    continue  # aten::*, autograd::*, ... (the bulk of a trace)
                if name.startswith("ProfilerStep#"):
                    cpu_steps.add(float(ev["ts"]), float(ev.get("dur", 0.0)), _step_number(name))
                    if trace.pid is None:
                        trace.pid = _int_or_none(ev.get("pid"))
                elif name.startswith(_CPU_KINDS):
                    kind = next(k for k in _CPU_KINDS if name.startswith(k))
                    ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
                    nbytes, group, op = _comm_meta(ev.get("args"), trace)
                    trace.cpu_comm[kind].add(ts, dur, op if op >= 0 else trace.name_id(canonical_op(name)))
                    trace.cpu_comm_bytes[kind].append(nbytes)
                    trace.cpu_comm_group[kind].append(group)
                elif name.startswith("enumerate(DataLoader)"):
                    data.add(float(ev["ts"]), float(ev.get("dur", 0.0)), 0)
            elif cat == "gpu_user_annotation":
                name = ev["name"]
                if name.startswith("ProfilerStep#") and ev.get("ph") == "X":
                    gpu_steps.add(float(ev["ts"]), float(ev.get("dur", 0.0)), _step_number(name))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue  # a malformed event (missing ts, non-string name): skipped, never half-recorded
    trace.events = n


def _step_number(name: str) -> int:
    try:
        return int(name[len("ProfilerStep#"):])
    except ValueError:
        return -1
