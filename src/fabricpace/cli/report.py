"""fabricpace report / import / export: HTML reports, trace importers and Perfetto export."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from fabricpace._errors import InputError
from fabricpace.cli._common import check_format, check_writable, count, stderr_progress


@contextmanager
def _byte_progress(
    label: str, enabled: bool
) -> Iterator[tuple[Callable[[int], None], Callable[[int], None]]]:
    """A rich progress bar over bytes on stderr; yields (advance, set_total)."""
    if not enabled:
        yield (lambda _n: None), (lambda _n: None)
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    with Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=Console(stderr=True), transient=True,
    ) as bar:
        task = bar.add_task(label, total=None)
        yield (lambda n: bar.advance(task, n)), (lambda n: bar.update(task, total=n))


def _rows(run_dir: Path, table: str) -> int:
    """Rows of a chunked table, from its Parquet footers (unreadable parts count as none)."""
    import pyarrow.parquet as pq

    total = 0
    from fabricpace.run.parts import live_parts

    files = [sub / n for sub in sorted((run_dir / table).glob("*/")) if sub.is_dir()
             for _, _, n in live_parts(p.name for p in sub.iterdir())]
    for f in files:
        try:
            total += pq.read_metadata(f).num_rows
        except (OSError, ValueError):  # a truncated part (ArrowInvalid is a ValueError)
            continue
    return total


def _parse_steps(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        a, _, b = text.partition(":")
        lo, hi = int(a), int(b or a)
    except ValueError as exc:
        raise InputError(f"--steps {text!r}: expected FIRST:LAST such as 10:12") from exc
    if hi < lo:
        raise InputError(f"--steps {text!r}: LAST must not be before FIRST")
    return lo, hi


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""

    @app.command("import")
    def import_cmd(
        fmt: str = typer.Argument(..., metavar="FORMAT", help="kineto | whatif | nccl-tests"),
        src: Path = typer.Argument(..., help="A trace/log file, or a folder of them (one per rank)."),
        out: Path = typer.Option(..., "-o", "--out", help="New run directory (must not exist or be empty)."),
        ops: bool = typer.Option(True, "--ops/--no-ops", help="kineto: keep GPU kernels as ops rows."),
        gpus_per_node: int | None = typer.Option(
            None, "--gpus-per-node", help="Ranks per node when the source does not tell (node = rank // N)."
        ),
        meta: Path | None = typer.Option(None, "--meta", help="whatif: the meta YAML (default: beside SRC)."),
        allow_clock_skew: bool = typer.Option(
            False, "--allow-clock-skew",
            help="kineto: ranks whose steps start far apart are one job on hosts whose clocks disagree "
                 "(no NTP), not traces of different runs: import them, aligned by their step starts.",
        ),
        output_format: str = typer.Option("text", "--format", help="text | json"),
    ) -> None:
        """Import traces from other tools into a fabricpace run directory."""
        check_format(output_format, ("text", "json"))
        check_writable(out, option="--out", creates_folders=True)
        if gpus_per_node is not None and gpus_per_node <= 0:
            raise InputError(f"--gpus-per-node {gpus_per_node}: must be a positive integer")
        if allow_clock_skew and fmt != "kineto":
            raise InputError(f"--allow-clock-skew: only for kineto traces, not {fmt!r} (drop the option)")
        if fmt == "kineto":
            from fabricpace.importers.kineto import KinetoConfig, import_kineto

            with _byte_progress("importing kineto", sys.stderr.isatty()) as (advance, total):
                run = import_kineto(src, out, config=KinetoConfig(ops=ops, gpus_per_node=gpus_per_node,
                                                                       allow_clock_skew=allow_clock_skew),
                                    progress=advance, on_total=total)
        elif fmt == "whatif":
            from fabricpace.importers.whatif import import_whatif

            run = import_whatif(src, out, meta=meta, gpus_per_node=gpus_per_node)
        elif fmt in ("nccl-tests", "nccl_tests"):
            from fabricpace.importers.nccl_tests import import_nccl_tests

            run = import_nccl_tests(src, out, gpus_per_node=gpus_per_node)
        else:
            raise InputError(f"import format {fmt!r}: choose one of kineto, whatif, nccl-tests")
        from fabricpace.run import load_run

        # Row counts from the Parquet footers: an imported trace can be large; only steps are read.
        data = load_run(run, tables=("steps",))
        n_steps = int(data.steps["step"].n_unique()) if data.steps.height else 0
        n_coll, n_ops = _rows(run, "collectives"), _rows(run, "ops")
        summary = {
            "run_dir": str(run),
            "format": fmt,
            "world_size": data.world_size,
            "nodes": data.manifest.nodes,
            "steps": n_steps,
            "step_rows": data.steps.height,
            "collective_rows": n_coll,
            "op_rows": n_ops,
        }
        if output_format == "json":
            print(json.dumps(summary))
        else:
            print(
                f"imported {fmt} -> {run}: {count(data.world_size, 'rank')}, {count(n_steps, 'step')}, "
                f"{count(n_coll, 'collective row')}, {count(n_ops, 'op row')}"
            )

    export_app = typer.Typer(help="Export a run directory to other tools' formats.", no_args_is_help=True)
    app.add_typer(export_app, name="export")

    @export_app.command("perfetto")
    def export_perfetto_cmd(
        run_dir: Path = typer.Argument(..., help="Run directory."),
        out: Path = typer.Option(
            ..., "-o", "--out", help="New Chrome trace JSON file (e.g. trace.json); never overwrites one."
        ),
        steps: str | None = typer.Option(None, "--steps", help="FIRST:LAST steps to export (default all)."),
        ops: bool = typer.Option(False, "--ops/--no-ops", help="Include per-op rows (can be large)."),
    ) -> None:
        """Write a Chrome trace JSON (Perfetto / chrome://tracing): one process per rank."""
        from fabricpace.report.perfetto import export_perfetto

        check_writable(out, option="--out", creates_folders=False)
        path = export_perfetto(run_dir, out, steps=_parse_steps(steps), ops=ops)
        print(f"wrote {path}", file=sys.stderr)

    @app.command("report")
    def report_cmd(
        run_dirs: list[Path] = typer.Argument(..., help="One or more run directories (several: scaling)."),
        out: Path = typer.Option(
            Path("report.html"), "-o", "--out", help="New HTML file to write (never overwrites one)."
        ),
        steps: str | None = typer.Option(
            None, "--steps", help="FIRST:LAST steps for the timeline (default: around the slowest step)."
        ),
        findings: bool = typer.Option(
            True, "--findings/--no-findings", help="Run the diagnosis for findings."
        ),
        cluster: Path | None = typer.Option(
            None, "--cluster", help="Cluster file or preset for the diagnosis."
        ),
    ) -> None:
        """Write one self-contained offline HTML report for the run(s)."""
        from fabricpace.report.html import write_report

        check_writable(out, option="--out", creates_folders=False)
        with stderr_progress() as bar:
            task = bar.add_task("report", total=None)

            def tick(what: str, done: int, total: int) -> None:
                bar.update(task, description=f"{what}: collectives chunks", completed=done, total=total)

            path = write_report(
                run_dirs, out, steps=_parse_steps(steps), findings=findings, cluster=cluster, progress=tick
            )
        print(f"wrote {path}", file=sys.stderr)
