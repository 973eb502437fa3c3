"""Fixtures for importer tests: small synthetic Kineto jobs written in the real trace layout."""

from __future__ import annotations

from pathlib import Path

import pytest

from fabricpace.importers.synthetic import SyntheticJob, write_job

SMALL = SyntheticJob(world_size=4, steps=6, kernels_per_step=8, slow_rank=2, slow_factor=1.3, seed=7)


@pytest.fixture(scope="session")
def small_job() -> SyntheticJob:
    """The job the kineto_* fixtures hold."""
    return SMALL


@pytest.fixture(scope="session")
def kineto_gz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four gzip traces with distributedInfo; rank 2 computes 30% slower."""
    folder = tmp_path_factory.mktemp("kineto_gz")
    write_job(folder, SMALL, gz=True)
    return folder


@pytest.fixture(scope="session")
def kineto_plain_noinfo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same job as plain .json without distributedInfo: ranks only in the file names."""
    folder = tmp_path_factory.mktemp("kineto_noinfo")
    write_job(folder, SMALL, gz=False, distributed_info=False, name="trace_rank-{rank}.pt.trace.json")
    return folder
