"""Fixtures shared by the segmentation tests."""
import pytest


@pytest.fixture(autouse=True)
def _no_compile(monkeypatch):
    """Keep the attention core eager: a torch.compile build costs seconds per new shape on CPU
    (subprocesses inherit the variable)."""
    monkeypatch.setenv('MMPOLA_NO_COMPILE', '1')
