"""Entry point of the ``fabricpace`` command. Errors are translated here, at the boundary.

Exit codes (DESIGN.md): 0 ok; 2 bad input or usage — one line saying what, where and how to fix,
no traceback; 1 anything else.
"""

from __future__ import annotations

import errno
import re
import sys
from pathlib import Path

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


def _print_version(value: bool) -> None:
    if value:
        import platform

        from fabricpace import __version__

        try:
            import torch

            torch_version = str(torch.__version__)
        except ImportError:
            torch_version = "not installed"
        # What a bug report needs: this package, Python and torch (observe and the lab need torch).
        print(f"fabricpace {__version__} (Python {platform.python_version()}, torch {torch_version})")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="print versions and exit"
    ),
) -> None:
    """Why distributed training stops scaling: observe, diagnose, simulate, pace."""


def _fail(code: int, message: str) -> None:
    print(f"fabricpace: error: {message}", file=sys.stderr)
    raise SystemExit(code)


def _click_exception() -> type[Exception]:
    """click's ClickException, found through typer's public BadParameter.

    typer >= 0.20 ships its own copy of click (``typer._click``) and older typer depends on click;
    ``BadParameter`` derives from ``UsageError(ClickException)`` in both, so its MRO names the class
    without importing a private module.
    """
    for cls in typer.BadParameter.__mro__:
        if cls.__name__ == "ClickException":
            return cls
    return typer.BadParameter  # pragma: no cover - click has had ClickException since 2.0


_ClickException = _click_exception()


def _usage_message(exc: Exception) -> str:
    """One line for a usage error: click's message plus where help is (no usage block, no box)."""
    text = " ".join(str(getattr(exc, "format_message", lambda: exc)()).split())
    path = getattr(getattr(exc, "ctx", None), "command_path", "")
    if not path:  # click's parser raises some errors (an option without its value) without a context
        return text
    verb = path.removeprefix("fabricpace").strip()
    return f"{verb + ': ' if verb else ''}{text.rstrip('.')}; see '{path} --help'"


def _os_error_message(exc: OSError) -> str:
    """'ro/r.html: cannot write (Permission denied); choose another path or fix its permissions'. A
    temporary file fabricpace writes next to an output ('.r.html.1678.tmp') is named as that output."""
    path = Path(str(exc.filename))
    shown = path.with_name(re.sub(r"^\.(.+?)(\.\d+)?\.tmp$", r"\1", path.name))
    reason = exc.strerror or type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return f"{shown}: {reason.lower()}; check the path (its folder must exist)"
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        return f"{shown}: cannot write ({reason.lower()}); free some space or choose another folder"
    return f"{shown}: {reason.lower()}; choose another path or fix its permissions"


def main() -> None:
    """Run the CLI with fabricpace's exit-code contract."""
    try:
        # standalone_mode=False: click's usage errors come here instead of being printed as a
        # multi-line box, so a typo'd option is one line like every other bad input (DESIGN.md).
        code = app(standalone_mode=False, prog_name="fabricpace")
    except _ClickException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `fabricpace lab` alone: help was printed
            raise SystemExit(getattr(exc, "exit_code", 2)) from None
        _fail(int(getattr(exc, "exit_code", 2)), _usage_message(exc))
    except typer.Abort:
        _fail(1, "aborted")
    except InputError as exc:
        _fail(2, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except FabricpaceError as exc:
        _fail(1, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    except NotADirectoryError as exc:
        # A path the user gave has a file where a folder must be (--out notes.txt/run); commands check
        # their outputs up front, this catches the rest (e.g. a verb that creates folders as it goes).
        _fail(2, f"{exc.filename}: a part of this path is a file, not a folder; choose another path")
    except (PermissionError, FileNotFoundError) as exc:
        # Commands check their outputs' folders up front (cli._common.check_writable); this catches a
        # folder that changed while the command ran, or a path no check foresaw: one line, not a
        # traceback. A file the user named is bad input like any other.
        if exc.filename is None:
            raise
        _fail(2, _os_error_message(exc))
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.ENOSPC, errno.EDQUOT) or exc.filename is None:
            raise
        _fail(2 if exc.errno == errno.EROFS else 1, _os_error_message(exc))
    except KeyboardInterrupt:
        _fail(130, "interrupted")
    else:
        # Without standalone mode, typer.Exit(n) (`fabricpace run` passes torchrun's exit code) and
        # --help come back as the return value. typer turns Ctrl-C into Exit(130), so it lands here too
        # and would leave silently.
        if code == 130:
            _fail(130, "interrupted")
        if isinstance(code, int) and code:
            raise SystemExit(code)


if __name__ == "__main__":
    main()
