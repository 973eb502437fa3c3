"""fabricpace place: rank placement that keeps ring neighbours inside a leaf."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
