"""How every shipped config's optimizer steps: with a ``paramwise_cfg`` (mmengine's default constructor would give
each parameter a group of its own) it is built by mmpola.runtime.param_groups' merging constructor, and AdamW runs
torch's fused implementation (docs/recipes.md)."""
import pytest

from mmpola.runtime.param_groups import MERGED_CONSTRUCTOR
from tests.fixtures.recipes import load, shipped_configs


@pytest.mark.parametrize('config', shipped_configs())
def test_paramwise_optimizers_merge_their_groups(config):
    wrapper = load(config).get('optim_wrapper', {})
    if wrapper.get('paramwise_cfg'):
        assert wrapper.get('constructor') == MERGED_CONSTRUCTOR, f'{config}: optim_wrapper.constructor is not merging'


@pytest.mark.parametrize('config', shipped_configs())
def test_adamw_steps_fused(config):
    optimizer = load(config).get('optim_wrapper', {}).get('optimizer', {})
    if optimizer.get('type') == 'AdamW':
        assert optimizer.get('fused') is True and not optimizer.get('foreach'), f'{config}: AdamW is not fused'
