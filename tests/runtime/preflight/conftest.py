"""Fixtures of the pre-flight tests: tiny generated data, and a verdict cache of each test's own."""
import pytest


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    """Verdicts on annotation files are cached; keep each test's cache to itself."""
    monkeypatch.setenv('MMPOLA_CACHE_DIR', str(tmp_path / 'cache'))


@pytest.fixture(scope='module')
def coco(tmp_path_factory):
    """The demo COCO set: 4 train / 2 val images of 64 px, 3 classes."""
    from mmpola.datasets import make_demo_coco
    root = tmp_path_factory.mktemp('preflight_coco')
    make_demo_coco(str(root), num_train=4, num_val=2, seed=1, image_shapes=((64, 64),), verbose=False)
    return root


@pytest.fixture(scope='module')
def ade(tmp_path_factory):
    """The demo ADE set: 3 train / 2 val images of 32 px."""
    from mmpola.datasets.demo_ade import make_demo_ade
    root = tmp_path_factory.mktemp('preflight_ade')
    make_demo_ade(str(root), num_train=3, num_val=2, size=32, seed=0)
    return root
