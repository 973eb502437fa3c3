"""fabricpace diagnose / report / import / export: findings, reports and importers."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
