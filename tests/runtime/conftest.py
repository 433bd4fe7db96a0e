"""Fixtures of the runtime tests."""
import pytest

from tests.fixtures.toy_runs import toy_config, train


@pytest.fixture(scope='session')
def straight(tmp_path_factory):
    """An uninterrupted tools/train.py run of the toy model (3 epochs x 5 iterations, one persistent
    data worker, every epoch's checkpoint kept): what the interrupted runs must end equal to."""
    tmp = tmp_path_factory.mktemp('straight')
    config = toy_config(tmp, keep=3, workers=1, persistent=True)
    train(config, tmp / 'work')
    return dict(config=config, work=tmp / 'work')
