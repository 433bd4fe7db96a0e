"""MergedGroupsOptimWrapperConstructor (mmpola.runtime.param_groups): the parameter groups of mmengine's default
constructor with those of equal options merged, the same updates; a checkpoint written with one group per
parameter resumes into the merged groups (in process and through tools/train.py)."""
import copy

import pytest
import torch
from mmengine.optim import build_optim_wrapper
from mmengine.optim.scheduler import LinearLR, MultiStepLR

from mmpola.errors import UserError
from mmpola.runtime.param_groups import MERGED_CONSTRUCTOR, merge_param_groups, merge_saved_param_groups
from tests.fixtures.toy_runs import load, toy_config, train_here


class Net(torch.nn.Module):

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Linear(4, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8))
        self.head = torch.nn.Linear(8, 3)
        self.frozen = torch.nn.Linear(3, 3)
        self.frozen.requires_grad_(False)


def _wrapper_cfg(constructor=None, **optimizer):
    cfg = dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05, foreach=True, **optimizer),
               paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0, custom_keys={'head': dict(lr_mult=0.1)}))
    if constructor:
        cfg['constructor'] = constructor
    return cfg


def _build(constructor=None, seed=0):
    torch.manual_seed(seed)
    model = Net()
    return model, build_optim_wrapper(model, _wrapper_cfg(constructor)).optimizer


def _options(optimizer, model):
    """{parameter name: its group's options} of an optimizer over ``model``."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: {k: v for k, v in g.items() if k != 'params'} for g in optimizer.param_groups
            for p in g['params']}


def _schedulers(optimizer):
    return [LinearLR(optimizer, start_factor=0.1, by_epoch=False, begin=0, end=3),
            MultiStepLR(optimizer, milestones=[4], gamma=0.5, by_epoch=False, begin=0, end=100)]


def _steps(model, optimizer, schedulers, count, seed):
    generator = torch.Generator().manual_seed(seed)
    for _ in range(count):
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.randn(p.shape, generator=generator)
        optimizer.step()
        for scheduler in schedulers:
            scheduler.step()


def test_groups_of_equal_options_are_merged_with_each_parameters_options_kept():
    model, per_param = _build()
    merged_model, merged = _build(MERGED_CONSTRUCTOR)
    assert len(per_param.param_groups) == 10  # one per trainable parameter (the frozen layer left out)
    # weights: lr and decay of the base; biases and norms: no decay; the head: a tenth of the lr (a custom key
    # overrides the other rules, so its bias is decayed)
    assert len(merged.param_groups) == 3
    assert _options(merged, merged_model) == _options(per_param, model)
    order = [n for n, p in model.named_parameters() if p.requires_grad]
    names = {id(p): n for n, p in merged_model.named_parameters()}
    merged_order = [names[id(p)] for g in merged.param_groups for p in g['params']]
    assert sorted(merged_order) == sorted(order)
    for group in merged.param_groups:  # each group's parameters in the model's order
        positions = [order.index(names[id(p)]) for p in group['params']]
        assert positions == sorted(positions)


def test_merged_groups_step_as_the_per_parameter_groups():
    """The same updates (element for element: the same operations on each tensor), lr schedules included."""
    model, per_param = _build()
    merged_model, merged = _build(MERGED_CONSTRUCTOR)
    _steps(model, per_param, _schedulers(per_param), 6, seed=1)
    _steps(merged_model, merged, _schedulers(merged), 6, seed=1)
    for (name, a), b in zip(model.named_parameters(), merged_model.parameters()):
        assert torch.equal(a, b), name
    assert _options(merged, merged_model) == _options(per_param, model)


def test_a_shared_parameter_is_refused_as_by_the_default_constructor():
    """A layer that two modules hold: torch refuses the parameter in two groups; merged into one group it would
    be stepped twice, so the groups stay as they are and torch's error is the same."""
    model = Net()
    model.tied = torch.nn.Linear(4, 8)
    model.tied.weight = model.stem.weight
    for constructor in (None, MERGED_CONSTRUCTOR):
        with pytest.raises(ValueError, match='some parameters appear in more than one parameter group'):
            build_optim_wrapper(model, _wrapper_cfg(constructor))
    cfg = _wrapper_cfg(MERGED_CONSTRUCTOR)
    cfg['paramwise_cfg']['bypass_duplicate'] = True  # mmengine's way: the second occurrence left out
    groups = build_optim_wrapper(model, cfg).optimizer.param_groups
    assert len(groups) == 3 and sum(len(g['params']) for g in groups) == 11  # the tied layer's bias


def test_options_that_cannot_be_compared_keep_their_groups():
    betas = torch.tensor([0.9, 0.999])
    groups = [dict(params=[0], betas=betas), dict(params=[1], betas=betas.clone()), dict(params=[2], lr=0.1)]
    assert [g['params'] for g in merge_param_groups(groups)] == [[0], [1], [2]]


def test_merge_param_groups_of_a_state_dict():
    groups = [dict(params=[0], lr=1.0), dict(params=[1], lr=0.1), dict(params=[2], lr=1.0), dict(params=[3, 4], lr=0.1)]
    assert merge_param_groups(groups) == [dict(params=[0, 2], lr=1.0), dict(params=[1, 3, 4], lr=0.1)]


def _checkpoint(model, optimizer, schedulers):
    return copy.deepcopy(dict(optimizer=optimizer.state_dict(), param_schedulers=[s.state_dict() for s in schedulers]))


def test_a_per_parameter_checkpoint_resumes_into_the_merged_groups():
    """Three steps with one group per parameter, its state merged into the run's groups and loaded, three steps
    more: as six steps with one group per parameter (lr schedules included)."""
    model, per_param = _build()
    schedulers = _schedulers(per_param)
    _steps(model, per_param, schedulers, 3, seed=2)
    checkpoint = _checkpoint(model, per_param, schedulers)
    _steps(model, per_param, schedulers, 3, seed=3)

    resumed_model, merged = _build(MERGED_CONSTRUCTOR, seed=5)
    resumed_model.load_state_dict(Net().state_dict())  # other weights: the checkpoint's come below
    note = merge_saved_param_groups(checkpoint, merged)
    assert note.startswith("[mmpola] --resume: the checkpoint's 10 optimizer parameter groups") and ' into the ' \
        "run's 3 " in note
    assert len(checkpoint['optimizer']['param_groups']) == 3
    assert all(len(s['base_values']) == 3 and len(s['_last_value']) == 3 for s in checkpoint['param_schedulers'])
    resumed_schedulers = _schedulers(merged)  # as mmengine resumes: schedulers, then the optimizer's state, theirs
    merged.load_state_dict(checkpoint['optimizer'])
    for scheduler, state in zip(resumed_schedulers, checkpoint['param_schedulers']):
        scheduler.load_state_dict(state)
    # the weights after the first three steps: replay them on a copy of the first model's start
    start, first = _build()
    _steps(start, first, _schedulers(first), 3, seed=2)
    resumed_model.load_state_dict(start.state_dict())
    _steps(resumed_model, merged, resumed_schedulers, 3, seed=3)
    for (name, a), b in zip(model.named_parameters(), resumed_model.parameters()):
        assert torch.equal(a, b), name
    assert _options(merged, resumed_model) == _options(per_param, model)


def _groups(checkpoint):
    return checkpoint['optimizer']['param_groups'], checkpoint['param_schedulers']


def test_a_checkpoint_of_the_run_s_own_groups_is_left_as_it_is():
    model, merged = _build(MERGED_CONSTRUCTOR)
    schedulers = _schedulers(merged)
    _steps(model, merged, schedulers, 2, seed=2)
    checkpoint = _checkpoint(model, merged, schedulers)
    before = copy.deepcopy(checkpoint)
    assert merge_saved_param_groups(checkpoint, merged) is None
    assert _groups(checkpoint) == _groups(before)
    assert merge_saved_param_groups({'state_dict': {}}, merged) is None  # no optimizer state


def test_groups_that_merge_otherwise_than_the_run_s_are_left_to_mmengine():
    model, per_param = _build()
    checkpoint = _checkpoint(model, per_param, [])
    checkpoint['optimizer']['param_groups'][0]['lr'] = 0.5  # a group of its own now: 4 groups, the run has 3
    _, merged = _build(MERGED_CONSTRUCTOR)
    before = copy.deepcopy(checkpoint)
    assert merge_saved_param_groups(checkpoint, merged) is None and _groups(checkpoint) == _groups(before)


def test_scheduler_values_that_differ_within_a_merged_group_stop_with_the_way_out():
    model, per_param = _build()
    schedulers = _schedulers(per_param)
    checkpoint = _checkpoint(model, per_param, schedulers)
    checkpoint['param_schedulers'][1]['base_values'][1] *= 2  # the stem's bias: merged with the other biases
    _, merged = _build(MERGED_CONSTRUCTOR)
    with pytest.raises(UserError, match='optim_wrapper.constructor=DefaultOptimWrapperConstructor'):
        merge_saved_param_groups(checkpoint, merged)


# the toy run's optimizer with a paramwise_cfg whose rule matches nothing: one group per parameter, of equal options
PARAMWISE = """
optim_wrapper = dict(optimizer=dict(type='AdamW', lr=0.05, weight_decay=0.01),
                     paramwise_cfg=dict(custom_keys={'no.such.layer': dict(decay_mult=0.0)}))
"""


def test_a_run_with_one_group_per_parameter_resumes_with_the_merged_groups(tmp_path, capsys):
    """tools/train.py: a run started with mmengine's constructor (one group per parameter) and resumed with
    the merging one ends with the weights of the run that went on without stopping; one line says so. Resumed with
    AdamW's fused implementation too (as the shipped configs run it), it goes on with the checkpoint's (foreach:
    torch's optimizer takes the options of the groups it loads), so the updates stay the same."""
    config = toy_config(tmp_path)
    with open(config, 'a') as f:
        f.write(PARAMWISE)
    train_here(capsys, config, tmp_path / 'straight')
    work = tmp_path / 'resumed'
    train_here(capsys, config, work, '--cfg-options', 'train_cfg.max_epochs=1')
    out = train_here(capsys, config, work, '--resume', '--cfg-options',
                     f'optim_wrapper.constructor={MERGED_CONSTRUCTOR}', 'optim_wrapper.optimizer.fused=True')
    assert "[mmpola] --resume: the checkpoint's 2 optimizer parameter groups (one per parameter) merged into the " \
        "run's 1" in out, out[-3000:]
    expected, resumed = load(tmp_path / 'straight' / 'epoch_3.pth'), load(work / 'epoch_3.pth')
    assert len(expected['optimizer']['param_groups']) == 2 and len(resumed['optimizer']['param_groups']) == 1
    for key, value in expected['state_dict'].items():
        assert torch.equal(value, resumed['state_dict'][key]), key
    assert resumed['optimizer']['param_groups'][0]['lr'] == expected['optimizer']['param_groups'][0]['lr']
    assert not resumed['optimizer']['param_groups'][0]['fused']  # the checkpoint's implementation
