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
from typing import Any

import typer

from fabricpace._errors import InputError
from fabricpace.cli._common import check_format, parse_int_list, parse_size_list

_KEYS = ("op", "nodes", "gpus", "bytes", "algorithm", "protocol", "time_us", "algbw_gbps", "busbw_gbps")
_DEFAULT_NODES = (2, 4, 8, 16, 32)


def _human(n: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""

    # Extra arguments are the rest of a shell glob after --calibrate (`--calibrate logs/*.log`).
    @app.command(context_settings={"allow_extra_args": True})
    def collective(
        ctx: typer.Context,
        cluster: str = typer.Option("dgx-h100-ib", "--cluster", help="preset name or cluster YAML file"),
        op: str = typer.Option(
            "all_reduce", "--op", help="all_reduce, all_gather, reduce_scatter, all_to_all or broadcast"
        ),
        nodes: str | None = typer.Option(
            None, "--nodes", help="node counts, comma-separated (default 2,4,8,16,32 up to the cluster size)"
        ),
        sizes: str = typer.Option("32M,128M,1G,8G", "--sizes", help="sizes as nccl-tests counts them"),
        gpus_per_node: int | None = typer.Option(None, "--gpus-per-node", help="GPUs used per node"),
        algorithm: str | None = typer.Option(
            None, "--algorithm", help="force ring|tree|nvls|nvls_tree|hierarchical (all_reduce)"
        ),
        protocol: str | None = typer.Option(None, "--protocol", help="force LL|LL128|Simple"),
        calibrate: list[str] | None = typer.Option(
            None, "--calibrate",
            help="nccl-tests logs to fit the model to: --calibrate a.log b.log (or logs/*.log), "
            "repeat the option, or comma-separate",
        ),
        save_calibration: Path | None = typer.Option(
            None, "--save-calibration", help="write the calibrated cluster file here (never overwrites)"
        ),
        seed: int | None = typer.Option(None, "--seed", help="ECMP hashing seed (default: the cluster's)"),
        explain: bool = typer.Option(False, "--explain", help="bottleneck links and flows sharing them"),
        fmt: str = typer.Option("table", "--format", help="table|json|csv"),
    ) -> None:
        """Predict collective time, algbw and busbw (nccl-tests definitions) on a cluster."""
        import numpy as np

        from fabricpace.fabric import collective_time, load_cluster

        check_format(fmt, ("table", "json", "csv"))
        if ctx.args:
            if not calibrate:
                raise InputError(
                    f"collective: unexpected argument(s) {' '.join(ctx.args)}; "
                    "see 'fabricpace collective --help'"
                )
            calibrate = [*calibrate, *ctx.args]
        cl = load_cluster(cluster)
        if nodes is None:  # the default list, cut to what the cluster has (a 16-node file is valid)
            node_list = [n for n in _DEFAULT_NODES if n <= cl.nodes] or [cl.nodes]
        else:
            node_list = parse_int_list(nodes, option="--nodes")
            too_big = [n for n in node_list if n > cl.nodes]
            if too_big:
                raise InputError(
                    f"--nodes {nodes}: cluster {cl.name!r} has {cl.nodes} nodes; ask for at most "
                    f"{cl.nodes}, or use a cluster file with more (docs/cluster-files.md)"
                )
        size_list = parse_size_list(sizes, option="--sizes")
        if not size_list:
            raise InputError(f"--sizes {sizes!r}: expected sizes such as 32M,1G")
        if calibrate:
            from fabricpace.fabric.calibrate import calibrate_cluster

            logs = [p for item in calibrate for p in item.split(",") if p.strip()]
            fit = calibrate_cluster(cl, logs)
            cl = fit.cluster
            print(fit.summary(), file=sys.stderr)
            if fit.ops and op not in fit.ops:
                print(
                    f"note: calibrated on {', '.join(fit.ops)} logs but predicting {op}: a fit carries over "
                    f"poorly between collectives (docs/cluster-files.md); calibrate with {op} logs",
                    file=sys.stderr,
                )
            if save_calibration is not None:
                from fabricpace.fabric.cluster import save_cluster

                if save_calibration.exists():
                    raise InputError(f"--save-calibration {save_calibration}: exists; choose a new file name")
                save_cluster(cl, save_calibration)
                print(f"calibrated cluster written to {save_calibration}", file=sys.stderr)
        elif save_calibration is not None:
            raise InputError("--save-calibration needs --calibrate LOG (the nccl-tests logs to fit)")

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
                    )
                    # the model's bottleneck may sit outside the network (NVLink, the NVSwitch)
                    ex["model_bottleneck"] = r.bottleneck
                    ex["text"] += (
                        f"\n  model: {r.algorithm}/{r.protocol}, {r.time_s * 1e6:.1f} us, latency "
                        f"{r.latency_s * 1e6:.1f} us, bottleneck {r.bottleneck}"
                    )
                    explains.append(ex)
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
                _human(int(d["bytes"])),
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
