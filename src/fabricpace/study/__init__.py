"""Scaling studies across backends (sim, local, lab), summarized by one shared function.

``run_study(StudyPlan(...))`` runs every (nodes, mode, repeat) point, reads each run directory with
``metrics.summarize_run`` and aggregates rows in the form of the paper's Table 1.
"""

from fabricpace.study.metrics import summarize_run
from fabricpace.study.runner import StudyPlan, StudyResult, aggregate, run_study
from fabricpace.study.scenario import Scenario, load_scenario

__all__ = ["Scenario", "StudyPlan", "StudyResult", "aggregate", "load_scenario", "run_study", "summarize_run"]
