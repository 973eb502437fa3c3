"""Column contract of the run directory (DESIGN.md). Names here are the contract: add, never rename.

Times are int64 nanoseconds on the run's aligned timeline (rank 0's clock, 0 = run start);
durations are int64 nanoseconds. Unknown values are null.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = "fabricpace.run/1"

RANK_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("node", pa.int32()),
        ("local_rank", pa.int32()),
        ("host", pa.string()),
        ("leaf", pa.int32()),
        ("dp_rank", pa.int32()),
        ("pp_stage", pa.int32()),
        ("tp_rank", pa.int32()),
        ("numa", pa.int32()),
        ("gpu", pa.string()),
        ("nic", pa.string()),
        ("clock_offset_ns", pa.int64()),
        ("clock_err_ns", pa.int64()),
    ]
)

STEP_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("step", pa.int64()),
        ("t_start_ns", pa.int64()),
        ("t_end_ns", pa.int64()),
        ("compute_ns", pa.int64()),
        ("wait_ns", pa.int64()),
        ("comm_ns", pa.int64()),
        ("data_ns", pa.int64()),
        ("gc_ns", pa.int64()),
        ("paced_ns", pa.int64()),
        ("samples", pa.int64()),
    ]
)

COLLECTIVE_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("step", pa.int64()),
        ("seq", pa.int64()),
        ("group", pa.dictionary(pa.int32(), pa.string())),
        ("op", pa.dictionary(pa.int32(), pa.string())),
        ("bytes", pa.int64()),
        ("t_enter_ns", pa.int64()),
        ("t_exit_ns", pa.int64()),
    ]
)

OPS_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("step", pa.int64()),
        ("op", pa.dictionary(pa.int32(), pa.string())),
        ("t_start_ns", pa.int64()),
        ("dur_ns", pa.int64()),
    ]
)

PACING_SCHEMA = pa.schema(
    [
        ("step", pa.int64()),
        ("rank", pa.int32()),
        ("policy", pa.string()),
        ("action", pa.string()),
        ("value", pa.float64()),
        ("reason", pa.string()),
    ]
)

RANK_COLUMNS = tuple(RANK_SCHEMA.names)
STEP_COLUMNS = tuple(STEP_SCHEMA.names)
COLLECTIVE_COLUMNS = tuple(COLLECTIVE_SCHEMA.names)
OPS_COLUMNS = tuple(OPS_SCHEMA.names)
PACING_COLUMNS = tuple(PACING_SCHEMA.names)

# pacing.parquet's schema metadata: the number of the last part of RUN/pacing/rank-*/ joined into it
# (pacing/decision_log.py). A run that did not close leaves the later parts there; readers add them.
PACING_PARTS_KEY = b"fabricpace.pacing_parts"

# Table name -> (schema, stored as a chunked folder?)
TABLES: dict[str, tuple[pa.Schema, bool]] = {
    "ranks": (RANK_SCHEMA, False),
    "steps": (STEP_SCHEMA, True),
    "collectives": (COLLECTIVE_SCHEMA, True),
    "ops": (OPS_SCHEMA, True),
    "pacing": (PACING_SCHEMA, False),
}
