"""What a lab, local or simulated run injected: the ground truth to hold the diagnosis against.

A run made by ``fabricpace lab run`` (``--backend lab`` or ``local``), by ``fabricpace demo`` or by a
lab/local study records its scenario in ``manifest.extra`` (``scenario``: its name, ``expect``,
``faults``: the scenario's faults as written) and what the launcher actually did in
``lab/lab.json`` (``events``: a ``throttle`` event per rank put under a cgroup CPU quota,
``foreign_flow_start``, ``uplink_change``; ``throttled_time_ns`` per throttled rank). A simulated run
records its noise file in ``manifest.extra.noise``. A run observed in a real job records none of this:
for it, :func:`from_manifest` returns None and the report shows nothing extra.

The demo prints the same lines before its local runs (:func:`scenario_faults` on the scenario file)
and, after the diagnosis, :func:`compare_line`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabricpace.diagnose.stats import named


@dataclass(frozen=True)
class Fault:
    """One injected fault: where, what (with its parameters), and how it was applied."""

    where: str  # "rank 2", "every rank", "node 1", "links leaf0->spine0, spine0->leaf0"
    what: str
    applied: str = ""  # how it was applied, or why it was not ("" when nothing is known)
    ranks: tuple[int, ...] = ()  # ranks it makes slow on purpose (throttle, sim slow)
    nodes: tuple[int, ...] = ()  # nodes it makes slow on purpose (sim slow node)


@dataclass(frozen=True)
class Injected:
    """The ground truth of one run."""

    kind: str  # "lab", "local" or "sim"
    name: str  # scenario or noise name
    faults: list[Fault] = field(default_factory=list)
    expect: str = ""  # the failure mode the scenario is meant to show (lab scenarios)
    notes: list[str] = field(default_factory=list)

    @property
    def slowed_ranks(self) -> tuple[int, ...]:
        return tuple(sorted({r for f in self.faults for r in f.ranks}))

    @property
    def slowed_nodes(self) -> tuple[int, ...]:
        return tuple(sorted({n for f in self.faults for n in f.nodes}))


def _num(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else f"{v:g}"


def _ranks_where(ranks: Any) -> tuple[str, tuple[int, ...]]:
    if ranks == "all":
        return "every rank", ()
    rs = tuple(int(r) for r in ranks or ())
    return named("rank", list(rs), limit=12), rs


def throttle_what(cpus: Any) -> str:
    return f"CPU quota {_num(cpus)} CPUs (a cgroup CPU quota on the rank's process)"


def scenario_faults(
    faults: Mapping[str, Any],
    *,
    backend: str,
    cgroup: bool | None = None,
    lab: Mapping[str, Any] | None = None,
) -> list[Fault]:
    """The faults of a lab scenario (``Scenario.faults`` dumped, as in ``manifest.extra.faults``).

    ``cgroup``: whether the throttle is a cgroup quota (True), extra compute without root (False), or
    unknown (None). ``lab``: the run's ``lab.json`` when it was read: its events say what was applied
    (and override ``cgroup``)."""
    events = list((lab or {}).get("events") or []) if lab is not None else None
    out: list[Fault] = []
    th = faults.get("throttle")
    if isinstance(th, Mapping):
        where, ranks = _ranks_where(th.get("ranks"))
        cpus = th.get("cpus", 0.05)
        done = [e for e in events or [] if isinstance(e, Mapping) and e.get("event") == "throttle"]
        if events is not None:
            cgroup = bool(done)
        if cgroup is None:
            applied = "how it was applied is not recorded (no lab/lab.json)"
            what = throttle_what(cpus)
        elif cgroup:
            what = throttle_what(cpus)
            spent = (lab or {}).get("throttled_time_ns") or {}
            held = [f"rank {r}: {spent[f'rank{r}'] / 1e9:.1f} s" for r in ranks
                    if isinstance(spent.get(f"rank{r}"), int | float)]
            applied = "applied when training started" if lab is not None else ""
            if held:
                applied += "; time the quota held it back: " + ", ".join(held)
        else:
            what = f"extra compute each step (the stand-in for a CPU quota of {_num(cpus)} CPUs)"
            applied = ("no cgroup CPU quota (it needs root and cgroup v1): the rank recomputes its step "
                       "on a copy")
        out.append(Fault(where, what, applied, ranks=ranks))
    gc = faults.get("gc_noise")
    if isinstance(gc, Mapping):
        where, _ = _ranks_where(gc.get("ranks", "all"))
        churn, heap, life = int(gc.get("churn", 20_000)), int(gc.get("heap", 300_000)), gc.get("lifetime", 3)
        out.append(Fault(
            where,
            f"GC churn: {churn // 2:,}–{churn * 3 // 2:,} cyclic objects allocated per step "
            f"(mean {churn:,}), each living {life} steps, over a live heap of {heap:,} objects that every "
            "full collection walks",
            "in the training loop (CPython's own collector pauses the ranks at different steps)",
        ))
    ff = faults.get("foreign_flow")
    if isinstance(ff, Mapping):
        on, off = float(ff.get("on_s", 0.0)), float(ff.get("off_s", 0.0))
        rhythm = "always on" if on == 0 and off == 0 else f"on {on:g} s / off {off:g} s"
        started = any(isinstance(e, Mapping) and e.get("event") == "foreign_flow_start" for e in events or [])
        out.append(Fault(
            "uplink between the first and last leaf",
            f"foreign bulk TCP traffic: {ff.get('streams', 4)} streams, {rhythm}",
            _fabric_applied(backend, events, started),
        ))
    uc = faults.get("uplink_change")
    if isinstance(uc, Mapping):
        done = [e for e in events or [] if isinstance(e, Mapping) and e.get("event") == "uplink_change"]
        applied = _fabric_applied(backend, events, bool(done),
                                  late="not applied: the run ended before it was due")
        if done and applied == "applied":
            applied = _change_applied(done[0])
        out.append(Fault(
            "every uplink",
            f"rate changed to {uc.get('rate')} after {_num(uc.get('after_s'))} s",
            applied,
        ))
    return out


def _change_applied(e: Mapping[str, Any]) -> str:
    """How a recorded uplink change met the run's steps. A change that landed after the last step had
    every transfer at the old rate: "applied" there contradicted the diagnosis (healthy, rightly)."""
    last = e.get("last_step")
    if last is None and isinstance(e.get("steps"), int):
        last = int(e["steps"]) - 1  # steps 0..steps-1
    if e.get("applied") is False:  # due once rank 0 was through its steps: the launcher did not make it
        return (f"scheduled at step {e.get('progress_step', '?')}, after the run's last step {last}: "
                "not applied")
    if "first_step" not in e:  # lab.json of an older fabricpace: the clock reading only
        return "applied (the step it landed at is not recorded)"
    first = e.get("first_step")
    if first is None:
        return (f"changed after the run's last step {last} had ended: no step ran under it (every "
                "transfer at the old rate)")
    return f"applied during step {first}: steps {first}–{last} ran under it"


def ring_crossings(rank_leaf: Sequence[int]) -> tuple[int, int]:
    """Ring edges (rank i -> i+1, the last back to the first) whose ends sit on different leaves, and
    the fewest any order of the same ranks can have (one per leaf used, none on a single leaf)."""
    n = len(rank_leaf)
    cross = sum(rank_leaf[i] != rank_leaf[(i + 1) % n] for i in range(n)) if n > 1 else 0
    used = len(set(rank_leaf))
    return cross, used if used > 1 else 0


def placement_fault(placement: Any, lab: Mapping[str, Any] | None, *,
                    backend: str) -> tuple[Fault | None, list[str]]:
    """The run's rank order as the scenario gave it (``manifest.extra.placement``, ``lab.json``'s
    ``topology``): a fault when it is not the packed one (``interleaved``, or a hostfile or order whose
    ring crosses leaves more often than it must), else a note; and a note with the lab's fabric.

    A placement is half of what the congested-uplink scenario injects (every ring hop across the
    spine); the report called an interleaved run "a healthy baseline" next to its own topology
    finding."""
    topo = (lab or {}).get("topology") or {}
    rank_node = [int(n) for n in topo.get("rank_node") or []]
    node_leaf = [int(v) for v in topo.get("node_leaf") or []]
    label = ",".join(map(str, placement)) if isinstance(placement, list) else str(placement or "")
    if not label and not rank_node:
        return None, []
    notes: list[str] = []
    fab = topo.get("fabric") or {}
    if fab:
        nodes, leaves = count_of(fab.get("nodes"), "node"), count_of(fab.get("leaves"), "leaf")
        notes.append(f"fabric: {nodes} on {leaves}, uplinks {fab.get('uplink')}, node links "
                     f"{fab.get('node_link')} (shaped with tc)")
    packed = rank_node == list(range(len(rank_node)))
    order = ", rank -> node " + ",".join(map(str, rank_node)) if rank_node and not packed else ""
    cross = ""
    extra_crossings = False
    if rank_node and node_leaf and max(rank_node) < len(node_leaf):
        got, least = ring_crossings([node_leaf[n] for n in rank_node])
        cross = f"; the ring crosses leaves {got}× per all-reduce (at least {least} with these nodes)"
        extra_crossings = got > least
    what = f"placement {label or 'as recorded'}{order}{cross}"
    if ((packed and bool(rank_node)) or label in ("", "contiguous")) and not extra_crossings:
        # The packed order (also as a hosts file, such as place's proposal): given, but no fault.
        if backend == "local":  # one nominal node per rank on loopback: nothing to say
            return None, notes
        notes.insert(0, f"{what} (ring neighbours share a leaf where they can: no placement fault)")
        return None, notes
    if backend == "local":
        applied = "not applied: the local backend has no fabric (loopback)"
    else:
        applied = "at launch (each rank started on its node)" if rank_node else ""
    return Fault("rank order", what, applied), notes


def count_of(n: Any, noun: str) -> str:
    plural = "leaves" if noun == "leaf" else f"{noun}s"
    return f"{n} {noun if n == 1 else plural}"


def _fabric_applied(backend: str, events: list[Any] | None, seen: bool,
                    late: str = "no start recorded") -> str:
    if backend == "local":
        return "not applied: the local backend has no fabric (loopback)"
    if events is None:
        return ""
    return "applied" if seen else late


def _sim_faults(noise: Mapping[str, Any], outside: Sequence[str]) -> tuple[list[Fault], list[str]]:
    """The faults of a simulator noise file (``manifest.extra.noise``); entries the job does not meet
    (``faults_outside_job``) are counted in a note, not listed."""
    skipped: dict[str, set[int]] = {}
    for text in outside:
        m = re.match(r"(slow|links|foreign)\.(\d+)", str(text))
        if m:
            skipped.setdefault(m.group(1), set()).add(int(m.group(2)))
    out: list[Fault] = []
    left = 0

    def steps(e: Mapping[str, Any]) -> str:
        a, b = int(e.get("from_step") or 0), e.get("to_step")
        if a == 0 and b is None:
            return ""
        return f", steps {a}–{'end' if b is None else int(b) - 1}"

    def why(e: Mapping[str, Any]) -> str:
        return f" ({e['reason']})" if e.get("reason") else ""

    jitter = noise.get("jitter") or {}
    if float(jitter.get("cv") or 0) > 0:
        out.append(Fault("every rank", f"compute jitter: CV {_num(jitter['cv'])} "
                                       f"({jitter.get('distribution', 'normal')}, per rank and step)"))
    gc = noise.get("gc") or {}
    if float(gc.get("garbage_mb_per_step") or 0) > 0:
        out.append(Fault("every rank", f"GC: {_num(gc['garbage_mb_per_step'])} MB of garbage per step, full "
                                       f"collection past ~{_num(gc.get('threshold_mb', 0))} MB, pause "
                                       f"{_num(gc.get('pause_ms_base', 0))} ms + "
                                       f"{_num(gc.get('pause_ms_per_mb', 0))} ms per MB"))
    pauses = noise.get("pauses") or {}
    if float(pauses.get("rate_hz") or 0) > 0:
        out.append(Fault("every rank", f"host pauses: {_num(pauses['rate_hz'])} per s, "
                                       f"{_num(pauses.get('duration_ms', 0))} ms each"))
    for i, s in enumerate(noise.get("slow") or []):
        if i in skipped.get("slow", set()):
            left += 1
            continue
        rank, node = s.get("rank"), s.get("node")
        where = f"rank {rank}" if rank is not None else f"node {node}"
        out.append(Fault(where, f"compute ×{_num(s.get('factor'))}{steps(s)}{why(s)}",
                         ranks=(int(rank),) if rank is not None else (),
                         nodes=(int(node),) if node is not None else ()))
    for i, s in enumerate(noise.get("links") or []):
        if i in skipped.get("links", set()):
            left += 1
            continue
        flap = ""
        if s.get("flap_period_steps"):
            flap = f", down {s.get('flap_down_steps')} of every {s['flap_period_steps']} steps"
        out.append(Fault(f"link {s.get('link')}",
                         f"capacity ×{_num(s.get('scale'))}{flap}{steps(s)}{why(s)}"))
    for i, f in enumerate(noise.get("foreign") or []):
        if i in skipped.get("foreign", set()):
            left += 1
            continue
        duty = "" if f.get("duty") is None else (
            f", in bursts (on {float(f['duty']):.0%} of steps, ~{_num(f.get('burst_steps', 20))} steps each)")
        out.append(Fault("links " + ", ".join(map(str, f.get("links") or [])),
                         f"another tenant's traffic: capacity ×{_num(f.get('scale'))} left to the job"
                         f"{duty}{steps(f)}{why(f)}"))
    notes = [f"{left} more entr{'y' if left == 1 else 'ies'} of the noise file name nodes or links this job "
             "does not use (manifest.extra.faults_outside_job)"] if left else []
    return out, notes


def read_lab_json(run_dir: Path, extra: Mapping[str, Any]) -> dict[str, Any] | None:
    """The run's ``lab.json`` (``manifest.extra.lab``, relative to the run directory), or None."""
    rel = extra.get("lab")
    if not isinstance(rel, str) or Path(rel).is_absolute() or ".." in Path(rel).parts:
        return None
    try:
        data = json.loads((run_dir / rel).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def from_manifest(source: str, extra: Mapping[str, Any] | None, run_dir: Path) -> Injected | None:
    """The ground truth recorded by a lab/local run or a simulation; None for any other run. A record
    that cannot be read (a hand-edited manifest: ``cpus: null``, ``ranks: ["x"]``) gives a section that
    says so instead of the faults: the report is derived output and must not fail on it."""
    try:
        return _from_manifest(source, extra, run_dir)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        key = "faults" if source in ("lab", "local") else "noise"
        why = f"{type(exc).__name__}: {exc}"
        return Injected(source, "?", [], "", [f"manifest.extra.{key} could not be read ({why}); the "
                                              "injected faults are not shown"])


def _from_manifest(source: str, extra: Mapping[str, Any] | None, run_dir: Path) -> Injected | None:
    if not isinstance(extra, Mapping):
        return None
    if source in ("lab", "local") and isinstance(extra.get("faults"), Mapping):
        lab = read_lab_json(run_dir, extra)
        faults = scenario_faults(extra["faults"], backend=source, lab=lab)
        notes = [] if lab is not None else ["lab/lab.json is missing or unreadable: what was applied, and "
                                            "how, is not recorded; the faults are the scenario's"]
        placed, fabric_notes = placement_fault(extra.get("placement"), lab, backend=source)
        faults = ([placed] if placed is not None else []) + faults
        notes += fabric_notes
        return Injected(source, str(extra.get("scenario") or "?"), faults, str(extra.get("expect") or ""),
                        notes)
    if source == "sim" and isinstance(extra.get("noise"), Mapping):
        noise = extra["noise"]
        outside = extra.get("faults_outside_job") or []
        faults, notes = _sim_faults(noise, outside if isinstance(outside, list) else [])
        name = str(noise.get("name") or "?")
        if noise.get("source"):
            name += f" ({noise['source']})"
        return Injected("sim", name, faults, "", notes)
    return None


def fault_lines(faults: Iterable[Fault]) -> list[str]:
    """One line per fault: ``rank 2: CPU quota 0.08 CPUs (...) — applied ...``."""
    return [f"{f.where}: {f.what}" + (f" — {f.applied}" if f.applied else "") for f in faults]


def _run_findings(findings: Iterable[Mapping[str, Any]], run_dir: Path | None) -> list[Mapping[str, Any]]:
    if run_dir is None:
        return list(findings)
    want = run_dir.resolve()
    return [f for f in findings if not f.get("run") or Path(str(f["run"])).resolve() == want]


def _ids(rs: set[int], ns: set[int]) -> str:
    return " and ".join(t for t in (named("rank", sorted(rs), limit=12) if rs else "",
                                    named("node", sorted(ns), limit=12) if ns else "") if t)


def compare_line(inj: Injected, findings: Iterable[Mapping[str, Any]], *, run_dir: Path | None = None,
                 who: str = "this run") -> str | None:
    """One sentence holding the diagnosis's culprits against the ranks (nodes) ``inj`` slowed on
    purpose; None when it slowed none. Findings of other runs (``run``) are left out. Culprit nodes
    count only where nodes were slowed (a local run puts each rank on a node of its own, so the
    diagnosis names rank 2 and node 2 for the same culprit)."""
    found = _run_findings(findings, run_dir)
    slowed_r, slowed_n = set(inj.slowed_ranks), set(inj.slowed_nodes)
    if not slowed_r and not slowed_n:
        return None
    named_r: set[int] = set()
    named_n: set[int] = set()
    for f in found:
        c = f.get("culprits") or {}
        named_r.update(int(r) for r in c.get("ranks") or [])
        named_n.update(int(n) for n in c.get("nodes") or [])
    if not slowed_n:
        named_n = set()
    elif not slowed_r:
        named_r = set()
    by = {r: f for f in inj.faults for r in f.ranks} | {("node", n): f for f in inj.faults for n in f.nodes}
    hows = [by[r].what for r in sorted(slowed_r) if r in by]
    hows += [by[("node", n)].what for n in sorted(slowed_n) if ("node", n) in by]
    how = "; ".join(dict.fromkeys(h.split(" (")[0] for h in hows))
    noun = "rank" if not slowed_n else "node" if not slowed_r else "one"
    the = f"the {noun}{'s' if len(slowed_r) + len(slowed_n) > 1 else ''} {who} slowed" + (
        f" ({how})" if how else "")
    truth = f"{_ids(slowed_r, slowed_n)}, {the}"
    if not named_r and not named_n:
        return f"the diagnosis named no culprit: it did not find {truth}"
    hit_r, hit_n = named_r & slowed_r, named_n & slowed_n
    got = _ids(named_r, named_n)
    if hit_r == slowed_r and hit_n == slowed_n:
        if named_r == slowed_r and named_n == slowed_n:
            return f"the diagnosis named {got} — {the}"
        return (f"the diagnosis named {got}: {truth}, and {_ids(named_r - slowed_r, named_n - slowed_n)}, "
                f"which {who} did not slow on purpose")
    if hit_r or hit_n:
        return (f"the diagnosis named {got}: it found {_ids(hit_r, hit_n)} but missed "
                f"{_ids(slowed_r - hit_r, slowed_n - hit_n)} of {truth}")
    return f"the diagnosis named {got}, not {truth}"


def cause_notes(inj: Injected, findings: Iterable[Mapping[str, Any]], *, run_dir: Path | None = None,
                who: str = "this run") -> list[str]:
    """For each slowed rank a finding gives a measured cause for: that cause next to the injected
    fault. A CPU quota (or extra compute) slows every CPU-bound part of the rank's step, so the
    component that grew most (GC walks of a large heap, say) is what the diagnosis measures, not
    what was injected."""
    if inj.kind not in ("lab", "local"):  # a simulated slow rank's factor is on its compute alone
        return []
    by = {r: f for f in inj.faults for r in f.ranks}
    out: list[str] = []
    for f in _run_findings(findings, run_dir):
        ev = f.get("evidence") or {}
        cause = ev.get("cause")
        ranks = [int(r) for r in (f.get("culprits") or {}).get("ranks") or [] if int(r) in by]
        if not isinstance(cause, str) or not ranks or cause == "slower own compute":
            continue
        fault = by[ranks[0]]
        cause = cause.split(" (")[0]  # (diagnose's own gloss on the cause is what this note says)
        out.append(
            f"{f.get('mode', '?')} on {named('rank', ranks, limit=12)}: the cause \"{cause}\" is the part "
            f"of the rank's step that grew, as measured; what {who} injected there is the "
            f"{fault.what.split(' (')[0]}, which slows all of the rank's CPU work (its garbage collections "
            "included)"
        )
    return out
