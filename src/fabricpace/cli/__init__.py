"""The ``fabricpace`` command line: a thin typer app, one module per verb group."""
