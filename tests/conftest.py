"""Test-wide settings."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch):
    """parplan's tables take COLUMNS where stdout is not a terminal (else 160 columns); pytest-xdist's workers set
    COLUMNS=80, so the tests would read other widths under -n than without it: every test starts without it, and
    a test that wants a width sets it."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture(scope="module")
def group_of_one(tmp_path_factory):
    """An in-process gloo group of one rank for a module's runtime tests (torch imported here, not for every test),
    destroyed after the module unless one existed before."""
    import torch.distributed as dist
    created = not dist.is_initialized()
    if created:
        store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "s"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield dist.group.WORLD
    if created:
        dist.destroy_process_group()
