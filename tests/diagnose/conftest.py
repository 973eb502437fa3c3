"""Fixtures for the diagnosis tests: synthetic run directories with exact, known faults."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

from fabricpace.diagnose.synthetic import SynthSpec, write_synthetic


@pytest.fixture(scope="session")
def synth(tmp_path_factory):
    """synth(name, **spec) -> run dir; cached per name for the session (they are read-only)."""
    root = tmp_path_factory.mktemp("synth")
    cache: dict[str, Path] = {}

    def make(name: str, **kw) -> Path:
        if name not in cache:
            cache[name] = write_synthetic(root / name, SynthSpec(**kw))
        return cache[name]

    return make


@pytest.fixture
def recorded(tmp_path):
    """A writable copy of a recorded run in ``data/real`` (the CLI writes diagnosis.json into it)."""

    def copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(Path(__file__).parent / "data" / "real" / name, dst)
        return dst

    return copy


@pytest.fixture
def rank_env():
    """``env(rank, world=2)``: the env:// rendezvous torchrun would set for a real gloo rank on this
    machine (one free loopback port per test), without its launcher (one torch start-up less)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])

    def env(rank: int, world: int = 2) -> dict[str, str]:
        return dict(os.environ, GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                    RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))

    return env
