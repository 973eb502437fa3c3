"""Diagnosis: name the failure mode, the culprit and the evidence for one or more run directories.

    from fabricpace.diagnose import diagnose
    d = diagnose(["runs/exp1"])          # -> Diagnosis; d.to_dict() is the JSON of DESIGN.md

Modules: ``metrics`` (arrival/wait/transfer per collective instance, dense rank × step matrices),
``culprits`` (who is slower than their peers), one detector per failure mode
(``sync_amplification``, ``persistent_straggler``, ``topology_contention``, ``input_stall``,
``stage_imbalance``), ``locality`` (the attribute culprits share), ``stats`` (what-if, bootstrap),
``scaling`` (several runs at different sizes), ``engine`` (abstentions and the verdict).
Thresholds live in ``config.DiagnoseConfig`` and are explained in docs/diagnosis.md.
"""

from fabricpace.diagnose.config import DiagnoseConfig
from fabricpace.diagnose.engine import diagnose
from fabricpace.diagnose.findings import Abstention, Culprits, Diagnosis, Finding, RunSummary

__all__ = ["Abstention", "Culprits", "DiagnoseConfig", "Diagnosis", "Finding", "RunSummary", "diagnose"]
