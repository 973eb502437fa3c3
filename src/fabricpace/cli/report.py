"""fabricpace report / import / export: HTML reports, trace importers and Perfetto export."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""
