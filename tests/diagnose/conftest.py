"""Fixtures for the diagnosis tests: synthetic run directories with exact, known faults."""

from __future__ import annotations

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
