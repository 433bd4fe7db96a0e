"""Fixtures of the tool tests."""
import pytest

from tests.fixtures.runs import make_tiny_coco


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    """Tiny COCO set (4 train / 4 val images of 64 px) and the demo detector for it (2 epochs x 2
    iterations); see :func:`tests.fixtures.runs.make_tiny_coco`."""
    return make_tiny_coco(tmp_path_factory.mktemp('tiny_coco'))
