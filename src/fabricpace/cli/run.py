"""fabricpace run: a thin torchrun launch on this machine with the observer's environment.

``fabricpace run --nproc 4 -- script.py ARGS`` runs ``python -m torch.distributed.run --standalone
--nproc-per-node 4 script.py ARGS`` and exits with the ranks' exit code (the first failed rank's; a
rank killed by signal N gives 128+N), where torchrun alone exits 1. ``--run-dir`` is passed to the
script's observer through FABRICPACE_RUN_DIR (``fabricpace.observe`` uses it when no run_dir is
given). Bad input (a missing script, a bad --nproc, torch not installed) is one line and exit 2.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from fabricpace._errors import InputError
from fabricpace.cli._common import check_output_path

# torchrun itself exits 1 whatever the ranks exited with; this runs torchrun's own main and exits with
# the first failed rank's code instead (a signal N as 128+N, as a shell reports it).
_TORCHRUN = (
    "import sys\n"
    "from torch.distributed.elastic.multiprocessing.errors import ChildFailedError\n"
    "from torch.distributed.run import main\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "except ChildFailedError as exc:\n"
    "    code = exc.get_first_failure()[1].exitcode\n"
    "    sys.exit(code if code > 0 else 128 - code if code < 0 else 1)\n"
)


def torchrun_command(nproc: int, script: str, args: list[str]) -> list[str]:
    """The command line that launches ``script`` on ``nproc`` local ranks (torchrun's arguments)."""
    return [sys.executable, "-c", _TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", script, *args]


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""

    @app.command(
        "run",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        help="Launch SCRIPT on N local ranks with torchrun: fabricpace run --nproc 4 -- train.py ARGS",
    )
    def run(
        ctx: typer.Context,
        nproc: Annotated[int, typer.Option("--nproc", help="ranks to start on this machine")] = 2,
        run_dir: Annotated[
            str | None, typer.Option("--run-dir", help="run directory for the observer (FABRICPACE_RUN_DIR)")
        ] = None,
    ) -> None:
        argv = list(ctx.args)
        if argv and argv[0] == "--":
            argv = argv[1:]
        if not argv:
            raise InputError("run: no script given; usage: fabricpace run --nproc 4 -- train.py ARGS")
        if nproc < 1:
            raise InputError(f"--nproc {nproc}: must be at least 1")
        script = argv[0]
        if not Path(script).is_file():
            raise InputError(f"run: script {script!r} not found; pass the path of a Python training script")
        if run_dir is not None:  # the ranks' observers would record nothing there, and training would go on
            check_output_path(Path(run_dir), option="--run-dir")
        if importlib.util.find_spec("torch") is None:
            raise InputError(
                "run: torch is not installed; install it with pip install '.[torch]' in the fabricpace"
                " checkout (or pip install torch)"
            )
        env = dict(os.environ)
        if run_dir is not None:
            env["FABRICPACE_RUN_DIR"] = run_dir
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # single machine: keep gloo on loopback
        proc = subprocess.run(torchrun_command(nproc, script, argv[1:]), env=env)
        raise typer.Exit(proc.returncode)
