"""Parameter groups with the same options merged into one: the optimizer's step in a few groups, not one per
parameter.

mmengine's ``DefaultOptimWrapperConstructor`` gives every parameter a group of its own as soon as the config
has a ``paramwise_cfg`` (Swin's and CSWin's recipes, the ImageNet recipes: no weight decay on norms, biases or
position tables). torch's optimizers step group by group, and each group's step is Python and, on a GPU, its own
launches of every ``_foreach_*`` kernel: a detector of a few hundred parameter tensors steps a few hundred
groups of one tensor each. :class:`MergedGroupsOptimWrapperConstructor` builds the same groups and merges those
whose options (lr, weight decay, any custom key) are equal, keeping the parameters' order: the updates are
those of the per-parameter groups, element for element, in as many groups as there are distinct options.

A run resumed from a checkpoint written with one group per parameter (before a config named this constructor)
continues: :func:`merge_saved_param_groups` merges the checkpoint's groups and the parameter schedulers'
per-group values in the same way before they are loaded (``SafeCheckpointHook`` calls it on ``--resume``).
"""
from mmengine.optim import DefaultOptimWrapperConstructor

from mmpola.errors import UserError
from mmpola.registry import OPTIM_WRAPPER_CONSTRUCTORS

__all__ = ['MergedGroupsOptimWrapperConstructor', 'merge_param_groups', 'merge_saved_param_groups',
           'DEFAULT_CONSTRUCTOR', 'MERGED_CONSTRUCTOR']

# the constructors' names as configs give them (``optim_wrapper.constructor``)
DEFAULT_CONSTRUCTOR = 'DefaultOptimWrapperConstructor'
MERGED_CONSTRUCTOR = 'mmpola.MergedGroupsOptimWrapperConstructor'


def _options(group):
    return {key: value for key, value in group.items() if key != 'params'}


def _same(a, b):
    """Whether two groups' options are equal (options that cannot be compared, such as tensors, are not)."""
    try:
        return bool(a == b)
    except (RuntimeError, TypeError, ValueError):
        return False


def _blocks(groups):
    """The indices of ``groups`` by equal options (everything but ``params``), in the order of their first
    group."""
    blocks = []
    for index, group in enumerate(groups):
        options = _options(group)
        for block in blocks:
            if _same(_options(groups[block[0]]), options):
                block.append(index)
                break
        else:
            blocks.append([index])
    return blocks


def merge_param_groups(groups):
    """``groups`` (optimizer parameter groups: dicts of ``params`` and options) with those of equal options
    merged into one: the first of them gives the options, the parameters follow one another in the groups'
    order. Works on a state dict's groups (``params`` as indices) too."""
    return [dict(_options(groups[block[0]]), params=[p for index in block for p in groups[index]['params']])
            for block in _blocks(groups)]


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class MergedGroupsOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """mmengine's ``DefaultOptimWrapperConstructor`` (same arguments, same ``paramwise_cfg`` rules and log
    lines) whose parameter groups of equal options are merged (:func:`merge_param_groups`; module docstring).
    Without a ``paramwise_cfg`` the default constructor already makes one group. A parameter that two modules
    share (twice in the groups: torch refuses that, mmengine's ``bypass_duplicate`` keeps its first group) leaves
    the groups as they are, so that torch's error names it as with the default constructor."""

    def add_params(self, params, module, prefix='', is_dcn_module=None):
        super().add_params(params, module, prefix, is_dcn_module)
        if prefix:  # a submodule: the model's call merges once, after all of them
            return
        ids = [id(p) for group in params for p in group['params']]
        if len(ids) == len(set(ids)):
            params[:] = merge_param_groups(params)


def _per_group_entries(state, count):
    """The keys of a parameter scheduler's ``state`` that hold one value per parameter group (lists of
    ``count`` values: ``base_values``, ``_last_value``, OneCycle's per-group bounds)."""
    return [key for key, value in state.items() if isinstance(value, (list, tuple)) and len(value) == count]


def _schedulers(saved):
    if isinstance(saved, dict):
        return [state for states in saved.values() for state in states]
    return list(saved or [])


def merge_saved_param_groups(checkpoint, optimizer):
    """Merge, in place, the parameter groups of ``checkpoint``'s optimizer state (and each parameter
    scheduler's per-group values) as :func:`merge_param_groups` merges them, where the checkpoint has one
    group per parameter and ``optimizer`` (the run's, built by :class:`MergedGroupsOptimWrapperConstructor`)
    the merged groups: returns a note for the log, or None where nothing was merged (the same number of
    groups, several optimizers, no optimizer state). A checkpoint whose groups merge into other groups than
    the run's is left as it is: mmengine's load then names the mismatch."""
    state = checkpoint.get('optimizer') if isinstance(checkpoint, dict) else None
    groups = getattr(optimizer, 'param_groups', None)
    if not isinstance(state, dict) or not isinstance(state.get('param_groups'), list) or not groups:
        return None
    saved = state['param_groups']
    if len(saved) == len(groups):
        return None
    blocks = _blocks(saved)
    if [sum(len(saved[i]['params']) for i in block) for block in blocks] != [len(g['params']) for g in groups]:
        return None
    schedulers = _schedulers(checkpoint.get('param_schedulers'))
    for scheduler in schedulers:
        for key in _per_group_entries(scheduler, len(saved)):
            values = scheduler[key]
            if any(values[i] != values[block[0]] for block in blocks for i in block):
                raise UserError(
                    f'--resume: the checkpoint\'s optimizer has one parameter group per parameter ({len(saved)}), '
                    f'this run merges the groups of equal options into {len(groups)}, but the checkpoint\'s '
                    f'parameter scheduler holds different {key} for groups that would merge. Resume with the '
                    f'checkpoint\'s groups: --cfg-options optim_wrapper.constructor={DEFAULT_CONSTRUCTOR}')
    state['param_groups'] = merge_param_groups(saved)
    for scheduler in schedulers:
        for key in _per_group_entries(scheduler, len(saved)):
            scheduler[key] = type(scheduler[key])(scheduler[key][block[0]] for block in blocks)
    return (f'[mmpola] --resume: the checkpoint\'s {len(saved)} optimizer parameter groups (one per parameter) '
            f'merged into the run\'s {len(groups)} (groups of equal options, MergedGroupsOptimWrapperConstructor)')
