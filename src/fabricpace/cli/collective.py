"""fabricpace collective: predicted collective times on a cluster (fabric model), nccl-tests style.

fabricpace collective --cluster dgx-h100-ib --op all_reduce --nodes 2,4,8,16,32 --sizes 32M,1G,8G
fabricpace collective --cluster my.yaml --calibrate n2.log n4.log --save-calibration fit.yaml
fabricpace collective --cluster roce-leaf-spine-2to1 --nodes 64 --sizes 1G --explain
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from typer.core import TyperCommand

from fabricpace._errors import InputError
from fabricpace.cli._common import (
    check_format,
    check_writable,
    human_size,
    parse_int_list,
    parse_size_list,
    size_range_note,
)

if TYPE_CHECKING:
    from fabricpace.fabric.nccl_tests import NcclTestsLog
    from fabricpace.fabric.nccl_tests_layout import LayoutHint

_KEYS = ("op", "nodes", "gpus", "bytes", "algorithm", "protocol", "time_us", "algbw_gbps", "busbw_gbps")
_DEFAULT_NODES = (2, 4, 8, 16, 32)
_DEFAULT_CLUSTER = "dgx-h100-ib"


class _KeepsRawArgs(TyperCommand):
    """A command that keeps its raw arguments in ``ctx.meta``: click hands the extra arguments over without
    the option they followed, and `--compare a.log b.log` must not fit b.log."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta["raw_args"] = list(args)
        out: list[str] = super().parse_args(ctx, args)
        return out


_MULTI = {"--calibrate": "calibrate", "--compare": "compare"}  # options whose shell globs give extras


def _extras_by_option(ctx: Any) -> dict[str, list[str]]:
    """The extra arguments, each under the option it followed (``""``: before any option). An option
    taking one value consumes the token after it; a flag consumes none; the rest are extras."""
    flags = {o for p in ctx.command.params if getattr(p, "is_flag", False) for o in p.opts}
    extras = list(ctx.args)
    out: dict[str, list[str]] = {}
    last, i, raw = "", 0, ctx.meta.get("raw_args", [])
    while i < len(raw) and extras:
        tok = raw[i]
        if tok == "--":  # the end of options: what follows belongs to no option (named so in the error)
            last, i = "--", i + 1
            continue
        if tok.startswith("--") and len(tok) > 2:
            last = tok.split("=", 1)[0]
            i += 1 if ("=" in tok or last in flags) else 2
            continue
        if tok == extras[0]:
            out.setdefault(last, []).append(extras.pop(0))
        i += 1
    if extras:  # not placed (cannot happen with click's parser); keep them visible rather than lose them
        out.setdefault("", []).extend(extras)
    return out


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""

    # Extra arguments are the rest of a shell glob after --calibrate or --compare (`--calibrate logs/*.log`).
    @app.command(cls=_KeepsRawArgs, context_settings={"allow_extra_args": True})
    def collective(
        ctx: typer.Context,
        cluster: str | None = typer.Option(
            None, "--cluster", help="preset name or cluster YAML file (default dgx-h100-ib)"
        ),
        op: str = typer.Option(
            "all_reduce", "--op", help="all_reduce, all_gather, reduce_scatter, all_to_all or broadcast"
        ),
        nodes: str | None = typer.Option(
            None, "--nodes", help="node counts, comma-separated (default 2,4,8,16,32 up to the cluster size)"
        ),
        sizes: str = typer.Option("32M,128M,1G,8G", "--sizes", help="sizes as nccl-tests counts them"),
        gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", help="GPUs used per node"),
        algorithm: str | None = typer.Option(
            None, "--algorithm",
            help="force an algorithm (NCCL_ALGO): all_reduce ring|tree|nvls (1 node)|nvls_tree|hierarchical; "
            "all_gather, reduce_scatter, broadcast ring; all_to_all p2p. nvls and nvls_tree need an NVSwitch "
            "with tuning.nvls: true",
        ),
        protocol: str | None = typer.Option(
            None, "--protocol",
            help="force a protocol (NCCL_PROTO, any case): LL|LL128|Simple; LL128 needs NVLink (not pcie); "
            "nvls, nvls_tree and hierarchical run Simple only",
        ),
        calibrate: list[str] | None = typer.Option(
            None, "--calibrate",
            help="nccl-tests logs to fit the model to: --calibrate a.log b.log (or logs/*.log), "
            "repeat the option, or comma-separate",
        ),
        save_calibration: Path | None = typer.Option(
            None, "--save-calibration", help="write the calibrated cluster file here (never overwrites)"
        ),
        seed: int | None = typer.Option(None, "--seed", help="ECMP hashing seed (default: the cluster's)"),
        explain: bool = typer.Option(
            False, "--explain",
            help="bottleneck links and flows sharing them (with --format csv: on stderr)",
        ),
        compare: list[str] | None = typer.Option(
            None, "--compare",
            help="nccl-tests logs to score the predictions against, without fitting to them "
            "(e.g. the 8-node log after calibrating on 2 and 4); comma-separate or repeat",
        ),
        plot: Path | None = typer.Option(
            None, "--plot",
            help="also write busbw against size, a line per node count and the calibration logs' "
            "measured rows, to this new HTML file (offline)",
        ),
        fmt: str = typer.Option("table", "--format", help="table|json|csv"),
    ) -> None:
        """Predict collective time, algbw and busbw (nccl-tests definitions) on a cluster."""
        import numpy as np

        from fabricpace.fabric import collective_time, load_cluster

        check_format(fmt, ("table", "json", "csv"))
        if seed is not None and seed < 0:
            raise InputError(f"--seed {seed}: must be 0 or more (the ECMP hashing seed)")
        # Outputs are checked before the fit and the predictions, not when they are written after them.
        if plot is not None:
            from fabricpace.report.output import check_new_file

            check_writable(plot, option="--plot", creates_folders=False, example="busbw.html")
            plot = check_new_file(plot, "busbw.html")
        if save_calibration is not None:
            if not calibrate and "--calibrate" not in _extras_by_option(ctx):
                raise InputError("--save-calibration needs --calibrate LOG (the nccl-tests logs to fit)")
            if save_calibration.exists() or save_calibration.is_symlink():
                raise InputError(f"--save-calibration {save_calibration}: exists; choose a new file name")
            check_writable(
                save_calibration, option="--save-calibration", creates_folders=False, example="fit.yaml"
            )
        for after, extra in _extras_by_option(ctx).items():
            if after == "--calibrate":
                calibrate = [*(calibrate or []), *extra]
            elif after == "--compare":
                compare = [*(compare or []), *extra]
            elif after == "--":
                raise InputError(
                    f"collective: unexpected argument(s) {' '.join(extra)} after '--': collective takes no "
                    "positional arguments; give nccl-tests logs to --calibrate or --compare"
                )
            elif after:
                raise InputError(
                    f"collective: unexpected argument(s) {' '.join(extra)} after {after}, which takes one "
                    f"value: comma-separate a list ({after} A,B); only --calibrate and --compare take "
                    "several files"
                )
            else:
                raise InputError(
                    f"collective: unexpected argument(s) {' '.join(extra)}; "
                    "see 'fabricpace collective --help'"
                )
        cl = load_cluster(cluster or _DEFAULT_CLUSTER)
        # the default preset's 8 GPUs per node must not settle how a log ran: only a cluster the user
        # named, or --gpus-per-node, may (an abridged 4 x 4 log of device-0 ranks read as 2 x 8)
        named = cluster is not None
        hint = _layout_hint(cl, gpus_per_node, "--gpus-per-node", named=named)
        if nodes is None:  # the default list, cut to what the cluster has (a 16-node file is valid)
            node_list = [n for n in _DEFAULT_NODES if n <= cl.nodes] or [cl.nodes]
        else:
            node_list = parse_int_list(nodes, option="--nodes")
            twice = sorted({n for n in node_list if node_list.count(n) > 1})
            if twice:
                raise InputError(
                    f"--nodes {nodes}: node count {twice[0]} is given twice; give each node count once"
                )
            too_big = [n for n in node_list if n > cl.nodes]
            if too_big:
                raise InputError(
                    f"--nodes {nodes}: cluster {cl.name!r} has {cl.nodes} nodes; ask for at most "
                    f"{cl.nodes}, or use a cluster file with more (docs/cluster-files.md)"
                )
        size_list = parse_size_list(sizes, option="--sizes")
        if not size_list:
            raise InputError(f"--sizes {sizes!r}: expected sizes such as 32M,1G")
        logs = [p for item in calibrate or [] for p in item.split(",") if p.strip()]
        held = [p for item in compare or [] for p in item.split(",") if p.strip()]
        fitted = {Path(p).resolve(): p for p in logs}
        both = [p for p in held if Path(p).resolve() in fitted]
        if both:  # scored "without fitting to it" would be false: the fit has seen it
            raise InputError(
                f"--compare {both[0]}: also given to --calibrate, so the fit has seen it; hold it out of "
                "--calibrate to score a prediction"
            )
        if logs:
            from fabricpace.fabric.calibrate import calibrate_cluster

            fit = calibrate_cluster(cl, _with_op(logs, op, hint), op=op)
            print(fit.summary(), file=sys.stderr)
            for note in fit.notes(cl):
                print(note, file=sys.stderr)
            measured = fit.gpus_per_node
            if gpus_per_node is None and len(measured) == 1 and measured[0] < cl.gpus_per_node:
                # predict the configuration that was measured: a fit to 4 GPUs per node says little
                # about 8 (the NVLink and rail terms change), and the user compares against such runs
                gpus_per_node = measured[0]
                hint = _layout_hint(cl, gpus_per_node, "the calibration logs", named=named)
                print(
                    f"note: the calibration logs ran {gpus_per_node} GPUs per node and cluster {cl.name!r} "
                    f"has {cl.gpus_per_node}; predicting with {gpus_per_node} per node, as measured "
                    f"(--gpus-per-node {cl.gpus_per_node} for full nodes)",
                    file=sys.stderr,
                )
            cl = fit.cluster
            if fit.ops and op not in fit.ops:
                print(
                    f"note: calibrated on {', '.join(fit.ops)} logs but predicting {op}: a fit carries over "
                    f"poorly between collectives (docs/cluster-files.md); calibrate with {op} logs",
                    file=sys.stderr,
                )
            far = _extrapolation_note(node_list, fit.node_counts)
            if far:
                print(far, file=sys.stderr)
            if save_calibration is not None:
                from fabricpace.fabric.cluster import save_cluster

                if save_calibration.exists():  # created while the fit ran
                    raise InputError(f"--save-calibration {save_calibration}: exists; choose a new file name")
                save_cluster(cl, save_calibration)
                print(f"calibrated cluster written to {save_calibration}", file=sys.stderr)
        elif save_calibration is not None:
            raise InputError("--save-calibration needs --calibrate LOG (the nccl-tests logs to fit)")
        outside = size_range_note(size_list, cl.tuning.calibrated_sizes)
        if outside:
            print(outside, file=sys.stderr)

        rows: list[dict[str, Any]] = []
        explains: list[dict[str, Any]] = []
        for n in node_list:
            for s in size_list:
                rng = np.random.default_rng(cl.network.ecmp_seed if seed is None else seed)
                r = collective_time(
                    cl,
                    op,
                    s,
                    nodes=n,
                    gpus_per_node=gpus_per_node,
                    algorithm=algorithm,
                    protocol=protocol,
                    rng=rng,
                )
                d: dict[str, Any] = r.to_dict()
                rows.append(d)
                if explain:
                    from fabricpace.fabric.explain import explain_collective

                    ex = explain_collective(
                        cl,
                        op,
                        s,
                        nodes=n,
                        gpus_per_node=gpus_per_node,
                        algorithm=r.algorithm,
                        seed=cl.network.ecmp_seed if seed is None else seed,
                        prefer=r.bottleneck,
                    )
                    # the model's bottleneck may sit outside the network (NVLink, the NVSwitch)
                    ex["model_bottleneck"] = r.bottleneck
                    ex["text"] += (
                        f"\n  model: {r.algorithm}/{r.protocol}, {r.time_s * 1e6:.1f} us, latency "
                        f"{r.latency_s * 1e6:.1f} us, bottleneck {r.bottleneck}"
                    )
                    explains.append(ex)
        if held:
            print(_score(cl, op, held, gpus_per_node, algorithm, protocol, seed, hint), file=sys.stderr)
        if plot is not None:
            _plot(
                plot, cl, op, node_list, size_list, logs, held, gpus_per_node, algorithm, protocol, seed, hint
            )
        if fmt == "json":
            out = [{k: d[k] for k in (*_KEYS, "latency_us", "bottleneck", "bottleneck_flows")} for d in rows]
            if explain:
                for o, e in zip(out, explains, strict=True):
                    o["explain"] = e
            print(json.dumps(out, indent=2))
            return
        if fmt == "csv":
            buf = io.StringIO()
            w = csv.DictWriter(buf, fieldnames=[*_KEYS, "bottleneck"], extrasaction="ignore")
            w.writeheader()
            for d in rows:
                w.writerow(d)
            sys.stdout.write(buf.getvalue())
            for e in explains:  # a CSV has no place for them: stderr, so stdout stays one table
                print(e["text"], file=sys.stderr)
            return
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"{op} on {cl.name} (model: {cl.tuning.source})")
        for col in (
            "nodes",
            "gpus",
            "size",
            "algorithm",
            "protocol",
            "time (us)",
            "algbw GB/s",
            "busbw GB/s",
            "bottleneck",
        ):
            t.add_column(
                col, justify="right" if col not in ("algorithm", "protocol", "bottleneck") else "left"
            )
        for d in rows:
            t.add_row(
                str(d["nodes"]),
                str(d["gpus"]),
                human_size(int(d["bytes"])),
                str(d["algorithm"]),
                str(d["protocol"]),
                f"{d['time_us']:.1f}",
                f"{d['algbw_gbps']:.2f}",
                f"{d['busbw_gbps']:.2f}",
                str(d["bottleneck"]),
            )
        console = Console()
        if not console.is_terminal:  # piped: do not squeeze the table into 80 columns
            console = Console(width=160)
        console.print(t)
        for e in explains:
            console.print(e["text"])


def _layout_hint(
    cl: Any, gpus_per_node: int | None, given_by: str, *, named: bool
) -> LayoutHint | None:
    """GPUs per node for a log that cannot tell them (``nccl_tests_layout``): ``gpus_per_node`` (named
    ``given_by`` in the note) when given, else the cluster file's when the user ``named`` it (--cluster),
    else none: such a log is then refused with what would tell it."""
    from fabricpace.fabric.nccl_tests_layout import LayoutHint

    if gpus_per_node is not None:
        return LayoutHint(gpus_per_node=gpus_per_node, source=given_by)
    if not named:
        return None
    source = f"the cluster file ({cl.name!r}; give --gpus-per-node if the run used fewer)"
    return LayoutHint(gpus_per_node=cl.gpus_per_node, source=source)


def _with_op(paths: list[str], op: str, hint: LayoutHint | None) -> list[NcclTestsLog]:
    """The calibration logs, parsed (``hint``: GPUs per node where a log cannot tell them); a log that
    does not name its collective (no '*_perf' command line, and a file name without it, as in the README's
    ``n2.log``) is taken to be of ``op`` (--op, or its default all_reduce), with a note on stderr, instead
    of being refused."""
    from dataclasses import replace

    from fabricpace.fabric.nccl_tests_runs import distinct_names, parse_logs

    out: list[NcclTestsLog] = []
    # one log per run of each file; files of one base name (per-job folders) named by their folders
    for log in distinct_names([lg for p in paths for lg in parse_logs(p, hint=hint)]):
        if log.op is None:
            print(
                f"note: {log.name}: the log does not name its collective (no '*_perf' line, and the "
                f"file name does not say); taken as {op} (--op)",
                file=sys.stderr,
            )
            log = replace(log, op=op)
        out.append(log)
    return out


def _extrapolation_note(node_list: list[int], fitted: tuple[int, ...]) -> str | None:
    """A note when predictions reach far beyond the calibration's node counts, with what the validation
    set (docs/cluster-files.md, "Accuracy on real data") showed at such distances."""
    if not fitted or not node_list:
        return None
    ratio = max(node_list) / max(fitted)
    if ratio <= 2:
        return None
    return (
        f"note: predicting up to {max(node_list)} nodes from logs of at most {max(fitted)} nodes "
        f"({ratio:.0f}x beyond): on the validation set the worst error grew with that distance "
        "(2x: 7%; 8x: 16-32%; 30-70x: 31% all-reduce, 92% all-gather; docs/cluster-files.md). "
        "Measure one larger node count and pass it to --compare to check"
    )


def _predict(
    cl: Any, op: str, nbytes: int, nodes: int, gpus_per_node: int | None, algorithm: str | None,
    protocol: str | None, seed: int | None,
) -> dict[str, Any]:
    import numpy as np

    from fabricpace.fabric import collective_time

    rng = np.random.default_rng(cl.network.ecmp_seed if seed is None else seed)
    r = collective_time(
        cl, op, nbytes, nodes=nodes, gpus_per_node=gpus_per_node, algorithm=algorithm, protocol=protocol,
        rng=rng,
    )
    return r.to_dict()


def _score(
    cl: Any, op: str, paths: list[str], gpus_per_node: int | None, algorithm: str | None,
    protocol: str | None, seed: int | None, hint: LayoutHint | None,
) -> str:
    """One paragraph: the model against measured rows it was not fitted to (32 MB-8 GB, out-of-place
    times, the sizes calibration uses), median and worst error and where the worst one is."""
    from dataclasses import replace

    from fabricpace.fabric.nccl_tests_runs import parse_logs, runs_notes, shown_names

    errs: list[tuple[float, int, int]] = []
    per_log: list[tuple[str, int, list[tuple[float, int, int]], bool]] = []  # name, nodes, errors, degraded
    notes: list[str] = []  # what reading the logs left out (a failed run's missing sizes, other sweeps)
    n_logs, several = 0, False
    shown = shown_names(paths)  # files of one base name (per-job folders) named by their folders
    for p in paths:
        name = shown[str(Path(p))]
        runs = [lg if name == Path(p).name else replace(lg, shown=name) for lg in parse_logs(p, hint=hint)]
        notes += runs_notes(runs)
        several |= len(runs) > 1
        if len(runs) > 1 and any(lg.op == op for lg in runs):
            # a sweep's file of several runs: its runs of other collectives are left out, as calibration
            # leaves out logs of other collectives
            other = [lg for lg in runs if lg.op not in (None, op)]
            if other:
                names = ", ".join(f"lines {lg.run[1]}-{lg.run[2]} ({lg.op})" for lg in other if lg.run)
                notes.append(f"note: {name}: compared its {op} runs only, leaving out {names}")
            runs = [lg for lg in runs if lg.op in (None, op)]
        for log in runs:
            n_logs += 1
            where = p if log.run is None else log.label
            notes += log.notes()
            if log.op not in (None, op):
                raise InputError(
                    f"--compare {where}: an {log.op} log; compare {op} predictions with {op} logs"
                )
            if log.nodes is None:
                raise InputError(
                    f"--compare {where}: no '#  Rank N ... on HOST' lines and no node count in the file "
                    "name, so the node count is unknown; give the complete log or name the file after its "
                    "node count (n8_all_reduce.log)"
                )
            if log.nodes > cl.nodes:
                raise InputError(f"--compare {where}: {log.nodes} nodes, more than cluster {cl.name!r} has")
            mine = _errors(cl, op, log, gpus_per_node, algorithm, protocol, seed)
            errs += mine
            per_log.append((log.name, log.nodes, mine, log.stalled_pair() is not None))
    if not errs:
        return "compared with 0 measured rows: none between 32 MB and 8 GB in the --compare logs"
    logs = f"{n_logs} run(s) in {len(paths)} file(s)" if several else f"{len(paths)} log(s)"
    out = "".join(f"{n}\n" for n in notes)
    pooled = _error_summary(errs, nodes=True)
    out += f"compared with {len(errs)} measured rows (32 MB-8 GB) of {logs}: {pooled}"
    if sum(1 for _, _, mine, _ in per_log if mine) > 1:
        # one line per log: a pooled median hides which node count or which job the misses come from
        for label, nodes, mine, degraded in per_log:
            if mine:
                flag = "; degraded (see its note): no model predicts it" if degraded else ""
                out += f"\n  {label} ({nodes} nodes, {len(mine)} rows): {_error_summary(mine)}{flag}"
        healthy = [x for _, _, mine, degraded in per_log if not degraded for x in mine]
        if healthy and len(healthy) < len(errs):
            rest = _error_summary(healthy, nodes=True)
            out += f"\n  without the degraded log(s): {len(healthy)} rows, {rest}"
    return out


def _error_summary(errs: list[tuple[float, int, int]], *, nodes: bool = False) -> str:
    """'time error median X%, worst +Y% (SIZE[ on N nodes])' of (relative error, nodes, size) rows."""
    import numpy as np

    e = np.abs([x[0] for x in errs])
    worst = errs[int(np.argmax(e))]
    where = f"{human_size(worst[2])} on {worst[1]} nodes" if nodes else human_size(worst[2])
    return f"time error median {100 * float(np.median(e)):.1f}%, worst {100 * worst[0]:+.1f}% ({where})"


def _errors(
    cl: Any, op: str, log: NcclTestsLog, gpus_per_node: int | None, algorithm: str | None,
    protocol: str | None, seed: int | None,
) -> list[tuple[float, int, int]]:
    """(relative time error, nodes, size) of the model on each of ``log``'s rows from 32 MB to 8 GB."""
    errs = []
    assert log.nodes is not None  # checked by the caller
    gpn = gpus_per_node if gpus_per_node is not None else log.gpus_per_node
    for r in log.rows:
        if (32 << 20) <= r.size <= (8 << 30) and r.time_us > 0 and r.wrong == 0:  # log.notes() says so
            d = _predict(cl, op, r.size, log.nodes, gpn, algorithm, protocol, seed)
            errs.append((d["time_us"] / r.time_us - 1, log.nodes, r.size))
    return errs


def _plot(
    path: Path,
    cl: Any,
    op: str,
    node_list: list[int],
    size_list: list[int],
    logs: list[str],
    held: list[str],
    gpus_per_node: int | None,
    algorithm: str | None,
    protocol: str | None,
    seed: int | None,
    hint: LayoutHint | None,
) -> None:
    """The model's busbw on every power of two between the smallest and largest size (the requested ones
    and the logs' rows), so the lines show the algorithm and protocol switches, plus the measured rows:
    those the model was fitted to (``logs``) and those it was not (``held``)."""
    import numpy as np

    from fabricpace.fabric.nccl_tests_runs import parse_logs, shown_names
    from fabricpace.report.fabric_figures import busbw_figure, write_figure

    measured: list[dict[str, Any]] = []
    shown = shown_names([*logs, *held])
    for p, fitted in [*((p, True) for p in logs), *((p, False) for p in held)]:
        for log in parse_logs(p, hint=hint):  # one per run of a file that holds several
            if log.op not in (None, op) or log.nodes is None:
                continue
            source = shown[str(Path(p))] + log.name.removeprefix(Path(p).name)  # and which run of the file
            measured += [
                {"nodes": log.nodes, "bytes": r.size, "busbw_gbps": r.busbw, "source": source,
                 "fitted": fitted}
                for r in log.rows
                if r.busbw > 0
            ]
    nodes = sorted({*node_list, *(int(m["nodes"]) for m in measured if int(m["nodes"]) <= cl.nodes)})
    sizes = [*size_list, *(int(m["bytes"]) for m in measured)]
    lo, hi = int(np.log2(max(min(sizes), 1))), int(np.ceil(np.log2(max(sizes))))
    grid = sorted({*(1 << k for k in range(lo, hi + 1)), *size_list})
    predicted = [
        _predict(cl, op, s, n, gpus_per_node, algorithm, protocol, seed) for n in nodes for s in grid
    ]
    title = f"{op} on {cl.name}: busbw against size (model: {cl.tuning.source})"
    write_figure(busbw_figure(predicted, measured, title=title), path, title=title)
    print(f"plot written to {path}", file=sys.stderr)
