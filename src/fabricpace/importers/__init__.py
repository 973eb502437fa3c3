"""Importers: turn other tools' traces and logs into fabricpace run directories.

- ``kineto``: PyTorch profiler Chrome traces (``.json`` / ``.json.gz``), one file per rank;
- ``whatif``: the per-op Parquet + meta YAML of ByteDance's What-if straggler analysis (OSDI'25);
- ``nccl_tests``: nccl-tests logs, as a collectives-only run.

Every importer writes into a temporary folder and renames it into place at the end, so a failed
import leaves nothing behind and never touches an existing non-empty directory.
"""

FORMATS = ("kineto", "whatif", "nccl-tests")

__all__ = ["FORMATS"]
