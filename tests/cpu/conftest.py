"""Fixtures of the CPU tier's numerical tests."""

from __future__ import annotations

import pytest
from moe_scenarios import RunCache


@pytest.fixture(scope="session")
def mok_runs() -> RunCache:
    """Every moe_scenarios scenario run through mok on EP 1, 2 and 4 gloo ranks: each EP size is
    spawned once, on first use, and its per-rank results are kept for the session."""
    return RunCache()
