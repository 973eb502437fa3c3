"""The run directory: the one data format every part of fabricpace reads and writes.

See ``schema`` for the column contract, ``writer`` for crash-safe chunked writing and ``reader``
for loading a directory (with a report of what is missing or truncated), ``coverage`` for the steps
every rank covers.
"""

from fabricpace.run.coverage import Coverage
from fabricpace.run.manifest import Manifest, read_manifest, write_manifest
from fabricpace.run.reader import RunData, common_steps, load_run
from fabricpace.run.schema import (
    COLLECTIVE_COLUMNS,
    OPS_COLUMNS,
    PACING_COLUMNS,
    RANK_COLUMNS,
    SCHEMA_VERSION,
    STEP_COLUMNS,
)
from fabricpace.run.window import WINDOW_FIELDS, WindowSummary
from fabricpace.run.writer import ChunkWriter, RunRoot, RunWriter, write_table_atomic

__all__ = [
    "COLLECTIVE_COLUMNS",
    "OPS_COLUMNS",
    "PACING_COLUMNS",
    "RANK_COLUMNS",
    "SCHEMA_VERSION",
    "STEP_COLUMNS",
    "WINDOW_FIELDS",
    "ChunkWriter",
    "Coverage",
    "Manifest",
    "RunData",
    "RunRoot",
    "RunWriter",
    "WindowSummary",
    "common_steps",
    "load_run",
    "read_manifest",
    "write_manifest",
    "write_table_atomic",
]
