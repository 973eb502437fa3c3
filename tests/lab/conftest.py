"""Fixtures for the fabric lab tests: they need root and network namespaces, and always clean up."""

from __future__ import annotations

import pytest


@pytest.fixture
def lab_down_after():
    """Yields a list; every prefix appended to it is torn down afterwards, whatever happened."""
    prefixes: list[str] = []
    try:
        yield prefixes
    finally:
        from fabricpace.lab import fabric

        errors = []
        for prefix in prefixes:
            try:
                fabric.down(prefix)
            except Exception as exc:  # keep tearing down the others; report at the end
                errors.append(exc)
        if errors:
            raise errors[0]
