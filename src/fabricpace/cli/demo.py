"""fabricpace demo: the whole loop, small enough for a laptop."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's commands to the app."""

    @app.command()
    def demo() -> None:
        """Run the demo: simulated paper study, a real local run, diagnosis, pacing, report."""
        import fabricpace

        typer.echo(f"fabricpace {fabricpace.__version__}")
