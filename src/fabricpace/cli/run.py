"""fabricpace run: a thin torchrun launch on this machine with the observer's environment."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
