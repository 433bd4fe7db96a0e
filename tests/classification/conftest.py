"""Fixtures of the classification tests: a tiny generated dataset (golden data: tests/conftest.py)."""
import pytest

import mmpola.classification  # noqa: F401


@pytest.fixture(scope='session')
def tiny_imagenet(tmp_path_factory):
    """A tiny demo dataset in the ImageNet layout: 6 classes, 4 train / 2 val images each, 64 px."""
    from mmpola.classification.demo_imagenet import make_demo_imagenet
    root = str(tmp_path_factory.mktemp('tiny_imagenet'))
    make_demo_imagenet(root, num_train=4, num_val=2, size=64, seed=0)
    return root
