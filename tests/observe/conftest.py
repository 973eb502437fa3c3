"""Fixtures for the observer tests: real gloo ranks as subprocesses (launcher: tests/conftest.py)."""

from __future__ import annotations

import functools

import pytest


@pytest.fixture(scope="session")
def launcher(gloo_ranks):
    """(launch_ranks, free_port): the test modules cannot import conftest under importlib mode. Ranks
    are told they share one host; 150 s per rank unless the test says otherwise."""
    launch, port = gloo_ranks
    return functools.partial(launch, timeout=150), port


@pytest.fixture
def gloo_world1(gloo_ranks):
    """A real one-rank gloo process group (DDP with world size 1) for the duration of a test."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{gloo_ranks[1]()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
