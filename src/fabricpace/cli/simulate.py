"""fabricpace simulate / study: training simulator and scaling studies."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import typer

from fabricpace._errors import InputError
from fabricpace.cli._common import (
    check_format,
    check_writable,
    count,
    parse_int_list,
    require_torch,
    size_range_note,
    stderr_progress,
)


def _bucket_size_note(cluster: str | None, workload: str | None) -> str | None:
    """``collective``'s note on sizes outside a calibrated cluster's fitted range, for the workload's
    gradient buckets: a calibration on 32 MiB-8 GiB nccl-tests rows times DDP's 1 MiB first bucket up
    to 2x too slow, and a simulation sums thousands of such buckets (planner audit 16)."""
    if cluster is None or workload is None:
        return None
    from fabricpace.fabric import load_cluster
    from fabricpace.sim import load_workload

    fitted = load_cluster(cluster).tuning.calibrated_sizes
    if fitted is None:
        return None
    sizes = sorted({int(b) for b in load_workload(workload).buckets()})
    return size_range_note(sizes, fitted, what=f"{cluster} is calibrated; gradient bucket size(s)",
                           name=lambda n: f"{n / (1 << 20):.3g} MiB")


def _default_out(prefix: str) -> Path:
    """``runs/PREFIX-TIME``, or the first free ``-1``, ``-2``, ... sibling, created here (empty).

    The name is to the second: two commands started in the same second (a loop of small runs) used to
    pick the same folder, and the second was refused with "already exists" although the user gave no
    --out. Creating the folder claims it atomically, so concurrent commands each get their own; the
    commands accept an empty folder as their output (an explicit --out that exists is still refused).
    """
    base = Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"
    check_writable(base, option="--out (default)", creates_folders=True)
    base.parent.mkdir(parents=True, exist_ok=True)
    for i in range(10_000):
        candidate = base if i == 0 else base.with_name(f"{base.name}-{i}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise InputError(f"--out: {base} and 10,000 siblings exist; pass --out")  # pragma: no cover


@contextmanager
def _output(out: Path | None, prefix: str) -> Iterator[Path]:
    """The output folder: ``out`` as given (the caller checked it before any work) or a new default
    one, which is removed again when the command fails before writing into it."""
    if out is not None:
        yield out
        return
    claimed = _default_out(prefix)
    try:
        yield claimed
    except BaseException:
        with suppress(OSError):  # only when still empty: a partial run stays where the user sees it
            claimed.rmdir()
        raise


def _resolve_inputs(
    scenario: str | None, cluster: str | None, workload: str | None, noise: str | None
) -> tuple[str | None, str | None, str | None, Any]:
    """Explicit --cluster/--workload/--noise win over the scenario's files."""
    sc = None
    if scenario is not None:
        from fabricpace.study.scenario import load_scenario

        sc = load_scenario(scenario)
        cluster = cluster or sc.cluster
        workload = workload or sc.workload
        noise = noise if noise is not None else sc.noise
    return cluster, workload, noise, sc


def _check_counts(*, window: int, warmup: int | None) -> None:
    """Option values the library would refuse with its own parameter names, named as options here."""
    if window < 1:
        raise InputError(f"--window {window}: must be at least 1 (steps per pacing window)")
    if warmup is not None and warmup < 0:
        raise InputError(f"--warmup {warmup}: must be 0 or more (steps left out of the measurement)")


def _default_warmup(steps: int, sc: Any) -> int:
    """simulate's warm-up without --warmup: the scenario's ``study.warmup`` (so that simulate and study
    measure the same run over the same steps), else 20; fewer on short runs (two steps stay measured).

    A scenario whose file has no ``study:`` block gets study's default, 50, which is what ``study``
    leaves out of that scenario's runs; the help used to read "else 20" and a user took it for 20."""
    return min(_wanted_warmup(sc), max(steps - 2, 0))


def _wanted_warmup(sc: Any) -> int:
    return int(sc.study.warmup) if sc is not None else 20


# Fewer measured steps than this and the summary's CV (and p99) describe noise, not the run: a 30-step
# run of a scenario printed "2 steps after warm-up ... CV 0.000" without a word (audit 17 A1).
FEW_MEASURED = 10


def _few_steps_note(*, steps: int, skip: int, explicit: bool, sc: Any) -> str | None:
    """One line when the warm-up leaves fewer than FEW_MEASURED steps measured: how many, why, the fix."""
    measured = steps - skip
    if measured >= FEW_MEASURED:
        return None
    wanted = skip if explicit else _wanted_warmup(sc)
    if explicit:
        why = f"--warmup {skip}"
    else:
        if sc is None:
            source = f"the default {wanted}"
        elif "warmup" in sc.study.model_fields_set:
            source = f"the scenario's study.warmup {wanted}"
        else:
            source = f"study's default {wanted}, as scenario.yaml sets no study.warmup"
        why = f"warm-up {skip} ({source}{', lowered to fit' if skip < wanted else ''})"
    return (
        f"note: only {count(measured, 'step')} measured of {steps} after {why}; a throughput, CV and p99 "
        f"of so few steps say little: run --steps {wanted + FEW_MEASURED} or more, or lower --warmup"
    )


def study_table(rows: list[dict[str, Any]], title: str, *, width: int | None = None) -> Any:
    """The study table; ``width``: the terminal's columns. A CV with its ± made a 3-repeat table 84
    columns wide, which rich cut to "1897 …" in 80: when the table is wider than ``width``, a Δ's
    "(no change)" goes on a line of its own."""
    from rich.console import Console
    from rich.table import Table

    from fabricpace.study.table import table_cells, table_columns, table_notes

    def build(verdict_sep: str) -> Table:
        # The footnotes are those of what is printed: "± = ..." used to stand under a 1-repeat table
        # without a single ±.
        notes = table_notes(rows)
        t = Table(title=title, caption="\n".join(notes) if notes else None)
        for col in table_columns(rows):
            t.add_column(col, justify="right" if col != "mode" else "left", no_wrap=True)
        for cells in table_cells(rows, verdict_sep=verdict_sep):
            t.add_row(*cells)
        return t

    table = build(" ")
    if width is not None:
        natural = Console(width=10_000).measure(table).maximum
        if natural > width:
            table = build("\n")
    return table


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""

    @app.command()
    def simulate(
        cluster: str | None = typer.Option(None, "--cluster", help="cluster preset or YAML file"),
        workload: str | None = typer.Option(None, "--workload", help="workload preset or YAML file"),
        noise: str | None = typer.Option(None, "--noise", help="noise/fault preset or YAML file"),
        scenario: str | None = typer.Option(None, "--scenario", help="scenario name (paper) or folder"),
        nodes: int = typer.Option(4, "--nodes", help="nodes of the job"),
        steps: int = typer.Option(200, "--steps", help="training steps to simulate"),
        seed: int = typer.Option(1, "--seed"),
        out: Path | None = typer.Option(
            None, "--out", help="run directory to create (default runs/sim-TIME)"
        ),
        pacing: str = typer.Option("off", "--pacing", help="off | auto: pacing controller in the loop"),
        window: int = typer.Option(50, "--window", help="steps per window summary"),
        node_order: str = typer.Option(
            "packed", "--node-order",
            help="packed (topology-sorted hostfile) | shuffled (rendezvous order) | node ids in rank order "
            "(0,2,1,3) | a hosts file whose lines say node=K (place --out FILE --keep-tags writes one)",
        ),
        warmup: int | None = typer.Option(
            None,
            "--warmup",
            help="steps left out of the printed summary (default: the scenario's study.warmup, 50 when "
            "scenario.yaml sets none, as study does; else 20; fewer on short runs)",
        ),
        fmt: str = typer.Option("table", "--format", help="table | json"),
    ) -> None:
        """Simulate training on a cluster and write a run directory (diagnose/report read it)."""
        check_format(fmt, ("table", "json"))
        if pacing not in ("off", "auto"):
            raise InputError(f"--pacing {pacing!r}: choose off or auto")
        _check_counts(window=window, warmup=warmup)
        if steps < 2:
            # The summary printed below needs two steps; refuse before a run directory is written.
            raise InputError(f"--steps {steps}: must be at least 2 (the printed summary needs two steps)")
        if seed < 0:
            raise InputError(f"--seed {seed}: must be 0 or more")
        if warmup is not None and steps < warmup + 2:
            # before: the summary silently measured 2 steps instead of the ones asked to be left out
            raise InputError(
                f"--steps {steps} / --warmup {warmup}: need at least warmup + 2 steps to measure; "
                f"raise --steps to {warmup + 2} or lower --warmup"
            )
        if out is not None:
            check_writable(out, option="--out", creates_folders=True)
        cluster, workload, noise, sc = _resolve_inputs(scenario, cluster, workload, noise)
        if cluster is None or workload is None:
            raise InputError("simulate needs --cluster and --workload (or --scenario NAME|DIR)")
        bucket_note = _bucket_size_note(cluster, workload)
        if bucket_note is not None:
            typer.echo(bucket_note, err=True)
        from fabricpace.run.reader import load_run
        from fabricpace.sim import SimOptions, load_workload, rank_leaves, resolve_node_order, twin_policies
        from fabricpace.sim import simulate as run_sim
        from fabricpace.study.metrics import summarize_run

        order_spec = _node_order_spec(node_order, nodes=nodes)
        controller = None
        if pacing == "auto":
            from fabricpace.fabric import load_cluster
            from fabricpace.pacing import Controller

            cl = load_cluster(cluster)
            g = cl.gpus_per_node
            if nodes > cl.nodes or nodes < 1:
                raise InputError(f"--nodes {nodes}: cluster {cl.name!r} has 1..{cl.nodes} nodes")
            launch = resolve_node_order(order_spec, nodes=nodes, seed=seed)
            controller = Controller(
                nodes * g,
                policies=twin_policies(load_workload(workload)),
                leaves=rank_leaves(cl, nodes=nodes, node_order=launch),
            )
        with _output(out, "sim") as out_dir, stderr_progress(fmt != "json") as bar:
            task = bar.add_task(f"simulating {count(nodes, 'node')}", total=steps)
            run_dir = run_sim(
                cluster,
                workload,
                noise,
                nodes=nodes,
                steps=steps,
                seed=seed,
                out_dir=out_dir,
                controller=controller,
                progress=lambda n: bar.advance(task, n),
                options=SimOptions(window=window),
                node_order=order_spec,
            )
        skip = _default_warmup(steps, sc) if warmup is None else warmup
        summary = summarize_run(load_run(run_dir, tables=("steps",)), skip)
        few = _few_steps_note(steps=steps, skip=skip, explicit=warmup is not None, sc=sc)
        if few is not None:
            typer.echo(few, err=True)  # stderr: --format json keeps stdout one JSON document
        if fmt == "json":
            typer.echo(json.dumps({"run_dir": str(run_dir), "warmup": skip, **summary}))
            return
        typer.echo(
            f"{run_dir}: {count(summary['world_size'], 'GPU')} on {count(nodes, 'node')}, "
            f"{count(summary['steps'], 'step')} after warm-up: "
            f"{summary['throughput']:.1f} samples/s, {summary['period_s'] * 1e3:.1f} ms per step "
            f"(wall/steps), iteration {summary['iter_mean_s'] * 1e3:.1f} ms (first rank's start to last "
            f"rank's end; p99 {summary['iter_p99_s'] * 1e3:.1f} ms), CV {summary['cv']:.3f}"
        )
        typer.echo(f"next: fabricpace diagnose {run_dir}")

    @app.command()
    def study(
        backend: str = typer.Option("sim", "--backend", help="sim | local | lab"),
        cluster: str | None = typer.Option(None, "--cluster", help="cluster preset or YAML file (sim)"),
        workload: str | None = typer.Option(None, "--workload", help="workload preset or YAML file (sim)"),
        noise: str | None = typer.Option(None, "--noise", help="noise/fault preset or YAML file (sim)"),
        scenario: str | None = typer.Option(None, "--scenario", help="scenario name (paper) or folder"),
        nodes: str | None = typer.Option(
            None, "--nodes", help="node counts, e.g. 4,8,16 (default: the scenario's, else 4,8,16)"
        ),
        repeats: int | None = typer.Option(
            None, "--repeats", help="runs per point, different seeds (default: the scenario's, else 3)"
        ),
        steps: int | None = typer.Option(
            None, "--steps", help="steps per run (default: the scenario's, else 300)"
        ),
        warmup: int | None = typer.Option(
            None, "--warmup", help="steps each run leaves out (default: the scenario's, else 50)"
        ),
        seed: int = typer.Option(1, "--seed", help="seed of repeat 0 (repeat i uses seed + i)"),
        compare: str = typer.Option("baseline", "--compare", help="modes: baseline or baseline,paced"),
        window: int = typer.Option(50, "--window", help="steps per pacing window (sim)"),
        node_order: str = typer.Option(
            "packed", "--node-order", help="sim: packed (sorted hostfile) | shuffled (rendezvous order)"
        ),
        out: Path | None = typer.Option(
            None, "--out", help="study folder to create (default runs/study-TIME)"
        ),
        figures: bool = typer.Option(True, "--figures/--no-figures", help="write figures.html"),
        fmt: str = typer.Option("table", "--format", help="table | json"),
    ) -> None:
        """Scaling study: throughput and CV against node count, optionally baseline vs paced (Table 1)."""
        check_format(fmt, ("table", "json"))
        _check_counts(window=window, warmup=warmup)
        if out is not None:
            check_writable(out, option="--out", creates_folders=True)
        from dataclasses import replace

        from fabricpace.study.runner import BACKENDS, StudyPlan, check_plan, run_study

        if backend not in BACKENDS:
            raise InputError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
        # --scenario names a simulator scenario for the sim backend; local/lab backends get the name as
        # given (their own scenarios, fabricpace.lab.scenario).
        sc = None
        if backend == "sim":
            cluster, workload, noise, sc = _resolve_inputs(scenario, cluster, workload, noise)
        defaults = sc.study if sc is not None else None
        node_list = (
            parse_int_list(nodes, option="--nodes")
            if nodes is not None
            else (list(defaults.nodes) if defaults else [4, 8, 16])
        )
        modes = tuple(m.strip() for m in compare.split(",") if m.strip())
        plan = StudyPlan(
            backend=backend,
            nodes=tuple(node_list),
            modes=modes,
            repeats=repeats if repeats is not None else (defaults.repeats if defaults else 3),
            steps=steps if steps is not None else (defaults.steps if defaults else 300),
            warmup=warmup if warmup is not None else (defaults.warmup if defaults else 50),
            seed=seed,
            out_dir=out if out is not None else Path("runs") / "study-TIME",  # claimed after the checks
            cluster=cluster,
            workload=workload,
            noise=noise,
            scenario=scenario,
            window=window,
            node_order=node_order,
        )
        if sc is not None and nodes is None and plan.cluster is not None:
            from fabricpace.fabric import load_cluster

            have = load_cluster(plan.cluster).nodes
            too_many = [n for n in plan.nodes if n > have]
            if too_many:
                raise InputError(
                    f"{sc.folder / 'scenario.yaml'}: field 'study.nodes': {too_many[0]} nodes, but the "
                    f"cluster ({plan.cluster}) has {have}; lower study.nodes or raise the cluster's nodes"
                )
        check_plan(plan)  # bad input fails before the progress bar draws anything
        if backend == "sim":
            bucket_note = _bucket_size_note(plan.cluster, plan.workload)
            if bucket_note is not None:
                typer.echo(bucket_note, err=True)
        if backend != "sim":
            require_torch(f"study --backend {backend}")
        total = len(plan.points())
        with _output(out, "study") as out_dir:
            plan = replace(plan, out_dir=out_dir)
            with stderr_progress() as bar:
                # One bar for the points, named after the point now running (not the one just done),
                # and one for that point's steps (sim backend: a 1,024-node point takes minutes).
                task = bar.add_task(f"study ({backend})", total=total)
                steps_task = bar.add_task("  steps", total=plan.steps, visible=backend == "sim")

                def starting(label: str) -> None:
                    bar.update(task, description=f"study: {label}")
                    bar.reset(steps_task, total=plan.steps, visible=backend == "sim")

                result = run_study(
                    plan,
                    starting=starting,
                    progress=lambda _label: bar.advance(task),
                    steps_done=lambda n: bar.advance(steps_task, n),
                )
        written = []
        if figures:
            from fabricpace.report.study_figures import timeline_point, write_study_figures

            # the largest baseline run (with --compare paced,baseline it used to be the paced one)
            shown = timeline_point(result.points)
            written = write_study_figures(
                result.to_dict(), plan.out_dir, timeline_run=shown["run_dir"] if shown else None
            )
        if fmt == "json":
            # Where the results are: with the default --out the folder name is only known here (it used
            # to print the rows alone, so a script had to guess runs/study-TIME).
            doc = {
                "study_dir": str(plan.out_dir),
                "study_json": str(plan.out_dir / "study.json"),
                "figures": [str(p) for p in written],
                "plan": result.to_dict()["plan"],
                "rows": result.rows,
            }
            typer.echo(json.dumps(doc))
            return
        from rich.console import Console

        console = Console()
        console.print(
            study_table(
                result.rows,
                f"{backend} study ({count(plan.repeats, 'repeat')}, {count(plan.steps, 'step')})",
                width=console.width,
            )
        )
        typer.echo(f"wrote {plan.out_dir / 'study.json'}" + "".join(f", {p}" for p in written))


def _node_order_spec(value: str, *, nodes: int) -> str | list[int]:
    """--node-order as the simulator takes it: a named order, node ids in rank order, or the node=K tags
    of a hosts file in rank order (``place``'s proposal, written with --keep-tags) — so the simulator
    can apply the rank order ``place`` proposes."""
    from fabricpace.sim import NODE_ORDERS

    if value in NODE_ORDERS:
        return value
    if all(part.strip().isdigit() for part in value.split(",")):
        order = [int(part) for part in value.split(",")]
        if sorted(order) != list(range(nodes)):
            raise InputError(
                f"--node-order {value}: expected each node id 0..{nodes - 1} once ({nodes} nodes, --nodes)"
            )
        return order
    path = Path(value)
    if not path.is_file():
        raise InputError(
            f"--node-order {value!r}: not {', '.join(NODE_ORDERS)}, a list of node ids (0,2,1,3) or a "
            "hosts file that exists"
        )
    from fabricpace.hostfile import parse_hosts

    hosts = parse_hosts(path)
    untagged = [h for h in hosts if h.node is None]
    if untagged:
        raise InputError(
            f"{path}:{untagged[0].line}: host {untagged[0].name!r} has no node=K; the simulator needs each "
            "host's node id (fabricpace place --out FILE --keep-tags keeps them)"
        )
    order = [int(h.node) for h in hosts if h.node is not None]
    if sorted(order) != list(range(nodes)):
        raise InputError(
            f"{path}: its node= ids are {','.join(map(str, order))}; the simulator runs a {nodes}-node job "
            f"(--nodes) on the cluster's nodes 0..{nodes - 1}: give each of them once, one host per node"
        )
    return order
