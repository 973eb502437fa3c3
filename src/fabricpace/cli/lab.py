"""fabricpace lab: the fabric lab (network namespaces as nodes) — up, status, down, run."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from fabricpace.cli._common import check_format, check_output_path, require_torch
from fabricpace.lab.config import check_prefix


def _print(obj: dict[str, Any], fmt: str, lines: list[str]) -> None:
    if fmt == "json":
        typer.echo(json.dumps(obj, indent=2, default=str))
    else:
        for line in lines:
            typer.echo(line)


def _check_fault_ranks(sc: Any, world: int, source: str) -> None:
    """A fault on a rank the run does not have would silently not happen (the run looked healthy)."""
    from fabricpace._errors import InputError

    for name in ("throttle", "gc_noise"):
        ranks = getattr(getattr(sc.faults, name), "ranks", None)
        if isinstance(ranks, list):
            bad = [r for r in ranks if not 0 <= r < world]
            if bad:
                raise InputError(
                    f"{source}: faults.{name}.ranks {bad}: a {world}-rank run has ranks 0-{world - 1}; "
                    "fix the file or pass --nodes"
                )


def _placement_option(text: str, backend: str) -> str | list[int] | None:
    """--placement as the launcher takes it (checked against the lab once its size is known)."""
    from fabricpace._errors import InputError
    from fabricpace.lab.mirror import parse_order

    if not text:
        return None
    if backend == "local":
        raise InputError("--placement: the local backend has no fabric (every rank on loopback), so a "
                         "rank order changes nothing there; use --backend lab")
    if text in ("contiguous", "interleaved"):
        return text
    order = parse_order(text)
    if order is not None:
        return order
    path = Path(text).expanduser()
    if not path.is_file():
        raise InputError(f"--placement {text!r}: give contiguous, interleaved, node ids in rank order "
                         "(0,2,1,3) or an existing hosts file")
    return str(path.resolve())


def _next_commands(res: dict[str, Any], scenario: str, world: int, prefix: str) -> list[str]:
    """The commands that read the lab's cluster and hosts files (lab backend only)."""
    run, cluster, hosts = res["run_dir"], res.get("cluster_file"), res.get("hosts_file")
    if not hosts:
        return []
    if cluster is None:
        return [f"rank order as a hosts file: {hosts} (no cluster file: the cluster-file format fills "
                "each leaf in turn, and this lab's leaves hold different numbers of nodes)"]
    size = _grad_bytes(Path(run))
    return [
        f"the lab as a cluster file: {cluster}; its rank order as a hosts file: {hosts}",
        f"  fabricpace diagnose {run} --cluster {cluster}",
        f"  fabricpace place --cluster {cluster} --hosts {hosts}"
        + (f" --bytes {size}" if size else "") + " --out placed.txt",
        f"  fabricpace lab run --scenario {scenario} --placement placed.txt"
        + (f" --nodes {res['world']}" if res["world"] != world else "")
        + (f" --prefix {prefix}" if prefix != "fp-" else "") + " --out RUN_DIR",
    ]


def _grad_bytes(run: Path) -> int | None:
    """One all-reduce's bytes: the worker's fp32 gradients (the manifest's parameter count × 4)."""
    try:
        params = json.loads((run / "manifest.json").read_text())["workload"]["parameters"]
        return int(params) * 4
    except (OSError, ValueError, KeyError, TypeError):
        return None


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
    lab_app = typer.Typer(help="A real small cluster on this machine: namespaces as nodes, shaped uplinks.",
                      no_args_is_help=True)
    app.add_typer(lab_app, name="lab")

    @lab_app.command("up")
    def up_cmd(
        nodes: int = typer.Option(4, "--nodes", help="Number of nodes (one network namespace each)."),
        leaves: int = typer.Option(2, "--leaves", help="Number of leaf switches (bridges)."),
        uplink: str = typer.Option("100mbit", "--uplink", help="Leaf<->spine rate, each direction."),
        node_link: str = typer.Option("1gbit", "--node-link", help="Node<->leaf rate, each direction."),
        prefix: str = typer.Option("fp-", "--prefix", help="Name prefix of everything the lab creates."),
        fmt: str = typer.Option("table", "--format", help="table or json."),
    ) -> None:
        """Build the lab (idempotent: an identical lab that is up is left alone)."""
        from fabricpace.lab import fabric
        from fabricpace.lab.config import LabConfig, parse_rate

        check_format(fmt, ("table", "json"))
        cfg = LabConfig(nodes=nodes, leaves=leaves, uplink_bps=parse_rate(uplink, option="--uplink"),
                        node_link_bps=parse_rate(node_link, option="--node-link"), prefix=prefix)
        st = fabric.up(cfg)
        _print(st, fmt, [f"lab {prefix}: {st['action']}: {nodes} nodes on {leaves} leaves, "
                         f"uplink {uplink}, node link {node_link}",
                         f"namespaces: {' '.join(st['namespaces'])}",
                         *(f"repaired: {what}" for what in st.get("repaired", []))])

    @lab_app.command("status")
    def status_cmd(
        prefix: str = typer.Option("fp-", "--prefix"),
        fmt: str = typer.Option("table", "--format", help="table or json."),
    ) -> None:
        """Show what the lab has now (namespaces, uplink rates from tc, live processes)."""
        from fabricpace.lab import fabric

        check_format(fmt, ("table", "json"))
        check_prefix(prefix)
        fabric.require_lab()
        st = fabric.status(prefix)
        lines = [f"lab {prefix}: {'up' if st['up'] else 'down'}"]
        if st.get("config"):
            c = st["config"]
            lines.append(f"  {c['nodes']} nodes on {c['leaves']} leaves; node->leaf {c['node_leaf']}")
        for dev, rate in st.get("uplink_rates", {}).items():
            lines.append(f"  uplink {dev}: {rate}")
        lines += [f"  process {p['pid']} ({p['what']})" for p in st.get("processes", [])]
        lines += [f"  problem: {p}" for p in st.get("problems", [])]
        _print(st, fmt, lines)

    @lab_app.command("down")
    def down_cmd(
        prefix: str = typer.Option("fp-", "--prefix"),
        fmt: str = typer.Option("table", "--format", help="table or json."),
    ) -> None:
        """Remove every namespace, link, cgroup, mount and process the lab made (also after a crash)."""
        from fabricpace.lab import fabric

        check_format(fmt, ("table", "json"))
        check_prefix(prefix)
        res = fabric.down(prefix)
        _print(res, fmt, [f"lab {prefix}: down; removed {len(res['namespaces'])} namespaces, "
                          f"{res['processes']} processes, {res['cgroups']} cgroups"])

    @lab_app.command("measure")
    def measure_cmd(
        seconds: float = typer.Option(2.0, "--seconds", help="TCP transfer length (held to 0.5-30 s)."),
        prefix: str = typer.Option("fp-", "--prefix"),
        fmt: str = typer.Option("table", "--format", help="table or json."),
    ) -> None:
        """Measure the uplink with one real TCP transfer across the spine."""
        from fabricpace._errors import InputError
        from fabricpace.lab import fabric, traffic

        check_format(fmt, ("table", "json"))
        if not seconds > 0:  # also NaN; a zero or negative length was silently measured for 0.5 s
            raise InputError(f"--seconds {seconds:g}: give a positive length such as 2 (held to 0.5-30 s)")
        check_prefix(prefix)
        fabric.require_lab()
        cfg = fabric.load(prefix)
        if cfg.leaves < 2:  # the uplink joins two leaves: a one-leaf lab has none to measure
            raise InputError(
                f"lab {prefix!r} has 1 leaf, so no uplink to measure; bring it up with at least 2 "
                f"(fabricpace lab up --nodes {max(cfg.nodes, 2)} --leaves 2)"
            )
        m = traffic.measure_uplink(cfg, seconds=min(max(seconds, 0.5), 30.0))
        out = {"set_rate_bps": m.set_rate_bps, "goodput_bps": m.goodput_bps, "ratio": m.ratio,
               "bytes": m.bytes, "seconds": m.seconds}
        _print(out, fmt, [f"uplink set {m.set_rate_bps / 1e6:.1f} Mbit/s, measured "
                          f"{m.goodput_bps / 1e6:.1f} Mbit/s ({m.ratio:.1%}) over {m.seconds:.1f} s"])

    @lab_app.command("run")
    def run_cmd(
        scenario: str = typer.Option("healthy", "--scenario", help="Shipped scenario name or YAML file."),
        pacing: str = typer.Option("off", "--pacing", help="auto or off."),
        steps: int = typer.Option(0, "--steps", help="Steps (0: the scenario's default)."),
        nodes: int = typer.Option(0, "--nodes", help="Ranks (0: the scenario's default)."),
        out: Path = typer.Option(..., "--out", help="Run directory to write (must not exist or be empty)."),
        seed: int = typer.Option(0, "--seed"),
        backend: str = typer.Option("lab", "--backend", help="lab (namespaces) or local (loopback)."),
        prefix: str = typer.Option("fp-", "--prefix"),
        placement: str = typer.Option(
            "", "--placement",
            help="Rank order instead of the scenario's: contiguous, interleaved, node ids in rank order "
                 "(0,2,1,3) or a hosts file (fabricpace place's proposed hostfile).",
        ),
        fmt: str = typer.Option("table", "--format", help="table or json."),
    ) -> None:
        """Run a scenario: one rank per namespace, observer on, faults as the scenario says."""
        from fabricpace._errors import InputError
        from fabricpace.lab import launcher
        from fabricpace.lab.scenario import load_scenario

        check_format(fmt, ("table", "json"))
        if pacing not in ("auto", "off"):
            raise InputError(f"--pacing {pacing!r}: choose auto or off")
        if backend not in ("lab", "local"):
            raise InputError(f"--backend {backend!r}: choose lab or local")
        check_prefix(prefix)
        check_output_path(out, option="--out")
        if steps < 0:  # 0: the default; a negative count started ranks that trained nothing
            raise InputError(f"--steps {steps}: give a positive number of steps (0: the scenario's default)")
        if nodes > 64:  # the bound a scenario file's `world` has; 0 is the scenario's own
            raise InputError(f"--nodes {nodes}: a lab run takes 2 to 64 ranks")
        sc = load_scenario(scenario)
        _check_fault_ranks(sc, nodes or sc.world, scenario)
        placed = _placement_option(placement, backend)
        require_torch(f"lab run --backend {backend}")
        crowded = launcher.cpu_warning(nodes or sc.world)
        if crowded:
            typer.echo(f"warning: {crowded}", err=True)
        res = launcher.run_scenario(sc, out=out, pacing=pacing, steps=steps or None, nodes=nodes or None,
                                    seed=seed, backend=backend, prefix=prefix,
                                    progress=fmt != "json" and sys.stderr.isatty(), placement=placed)
        _print(res, fmt, [f"{res['scenario']}: {res['world']} ranks, {res['steps']} steps, "
                          f"pacing {pacing} -> {res['run_dir']}",
                          *_next_commands(res, scenario, sc.world, prefix)])
