"""Test-wide settings."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch):
    """parplan's tables take COLUMNS where stdout is not a terminal (else 160 columns); pytest-xdist's workers set
    COLUMNS=80, so the tests would read other widths under -n than without it: every test starts without it, and
    a test that wants a width sets it."""
    monkeypatch.delenv("COLUMNS", raising=False)
