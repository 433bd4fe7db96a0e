"""Fixtures of the tool tests: one tools/train.py run of the demo detector on the tiny COCO set, shared
by the tests of tools/train.py and tools/test.py."""
import os.path as osp

import pytest

from tests.fixtures.paths import PYTHON
from tests.fixtures.runs import run_tool


@pytest.fixture(scope='session')
def trained(tiny, tmp_path_factory):
    """tools/train.py CONFIG: two epochs of two iterations, validated at the end (its log and work dir)."""
    work_dir = tmp_path_factory.mktemp('train')
    log = run_tool([PYTHON, 'tools/train.py', tiny['config'], '--work-dir', str(work_dir)])
    assert 'Epoch(train) [2][2/2]' in log
    assert osp.isfile(work_dir / 'epoch_1.pth') and osp.isfile(work_dir / 'epoch_2.pth')
    return dict(work_dir=work_dir, log=log)
