"""Running the system tools the lab needs (ip, tc) with errors that say what failed and why."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Sequence

from fabricpace._errors import LabError

# Signals the command must not die of: the terminal's Ctrl-C, `kill`, a closed terminal.
_SHIELDED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def run(
    args: Sequence[str], *, check: bool = True, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run one command; a non-zero exit (when ``check``) is a LabError naming the command and stderr.

    The command runs in its own session with SIGINT, SIGTERM and SIGHUP blocked (a child inherits the
    signal mask; ``timeout`` still ends it with SIGKILL). Ctrl-C goes to the terminal's whole foreground
    process group, and a clean-up's ``tc``/``ip`` used to die of the user's second Ctrl-C half-way (the
    uplink stayed at the fault's rate). A new session alone is not enough: the child resets its signal
    handlers before it calls setsid(), and a Ctrl-C in between killed it. These commands are short; the
    launcher decides what an interrupt does once they have finished (the signal is held until then)."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SHIELDED)
    try:
        proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                              start_new_session=True)
    except FileNotFoundError as exc:
        raise LabError(f"{args[0]}: not found; install iproute2 (ip, tc) to use the fabric lab") from exc
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"{' '.join(args)}: timed out after {timeout:g} s") from exc
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    if check and proc.returncode != 0:
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        raise LabError(f"{' '.join(args)}: {msg[0] if msg else f'exit {proc.returncode}'}")
    return proc


def ok(args: Sequence[str], *, timeout: float = 30.0) -> bool:
    """Run a command whose failure is expected sometimes (teardown of half-built objects)."""
    try:
        return run(args, check=False, timeout=timeout).returncode == 0
    except LabError:
        return False


def lab_unavailable_reason() -> str | None:
    """Why the lab cannot run here (None when it can): root, iproute2 and network namespaces are needed."""
    if os.geteuid() != 0:
        # `lab up`/`down`/`status`/`measure` have no --backend: say where it exists.
        return ("the fabric lab needs root (network namespaces, tc, cgroups): run it with sudo, or without "
                "root use `fabricpace lab run --backend local`")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the fabric lab needs `{tool}` (iproute2); install it or use --backend local"
    if not os.path.exists("/proc/self/ns/net"):
        return "this kernel has no network namespaces; use --backend local instead"
    return None
