"""Entry point of the ``fabricpace`` command. Errors are translated here, at the boundary.

Exit codes (DESIGN.md): 0 ok; 2 bad input or usage — one line saying what, where and how to fix,
no traceback; 1 anything else.
"""

from __future__ import annotations

import sys

import typer

from fabricpace._errors import FabricpaceError, InputError
from fabricpace.cli import collective, demo, diagnose, lab, place, report, run, simulate

app = typer.Typer(
    name="fabricpace",
    help="Why distributed training stops scaling: observe, diagnose, simulate, pace.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

for _module in (demo, simulate, collective, diagnose, report, place, lab, run):
    _module.register(app)


def _fail(code: int, message: str) -> None:
    print(f"fabricpace: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def main() -> None:
    """Run the CLI with fabricpace's exit-code contract."""
    try:
        app()
    except InputError as exc:
        _fail(2, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except FabricpaceError as exc:
        _fail(1, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except KeyboardInterrupt:
        _fail(130, "interrupted")


if __name__ == "__main__":
    main()
