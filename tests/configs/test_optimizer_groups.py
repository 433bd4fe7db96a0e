"""Every shipped config whose optimizer has a ``paramwise_cfg`` (mmengine's default constructor would give each
parameter a group of its own) builds it with mmpola.runtime.param_groups' merging constructor."""
import pytest

from mmpola.runtime.param_groups import MERGED_CONSTRUCTOR
from tests.fixtures.recipes import load, shipped_configs


@pytest.mark.parametrize('config', shipped_configs())
def test_paramwise_optimizers_merge_their_groups(config):
    wrapper = load(config).get('optim_wrapper', {})
    if wrapper.get('paramwise_cfg'):
        assert wrapper.get('constructor') == MERGED_CONSTRUCTOR, f'{config}: optim_wrapper.constructor is not merging'
