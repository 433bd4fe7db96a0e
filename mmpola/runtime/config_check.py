"""A config's component entries against what they build: registered types and their arguments.

Before the Runner builds anything, every ``type=`` at a place whose registry is known (the model and
its backbone, necks and heads, datasets and their pipelines, samplers, hooks, metrics) is looked up
as mmengine's builder looks it up (the registry of the config's default scope, then its parents;
``mmpola.X`` names in mmpola's scope), and every other key of the entry is compared with the
arguments the class's ``__init__`` takes (along the classes it passes ``**kwargs`` on to with
``super().__init__(..., **kwargs)``, and mmengine's ``CheckpointHook``, whose ``**kwargs`` can take nothing
more). A misspelled name stops the run with one line naming the
config key and difflib's close matches, instead of a registry traceback once the Runner reaches
that part (for datasets: after the model was built). When a model part takes ``**kwargs`` for
anything else (the options of an attention it builds ...), an argument its signatures do not name
is tried: the part is built on the ``meta`` device (no memory, no weights) with and without it.

What the Runner builds itself is judged the same way, with the keys the Runner handles (or passes)
itself left out: the loops (``train_cfg``, ``val_cfg``, ``test_cfg``; without a ``type``, the loop
mmengine picks), ``optim_wrapper`` and its ``optimizer``, ``param_scheduler``, and each dataloader's
own arguments against ``torch.utils.data.DataLoader``'s.
"""
import ast
import inspect
import textwrap

import torch
from mmengine import registry as mmengine_registry

from mmpola.errors import UserError, close_matches

__all__ = ['check_config', 'accepted_arguments', 'component_entries', 'runner_entries', 'runtime_hook_notes']

# keys the builders read themselves: never arguments of the class
_BUILDER_KEYS = ('type', '_scope_', 'priority')


def _kwargs_take_nothing_more():
    """Classes whose ``**kwargs`` end in a call that takes no argument besides those the class passes itself:
    mmengine's ``CheckpointHook`` keeps them for ``Runner.save_checkpoint`` (every one of whose parameters it
    passes), so a misspelled key would fail only at the first save, after a whole epoch."""
    from mmengine.hooks import CheckpointHook
    return (CheckpointHook, )
_MODEL_PARTS = ('backbone', 'neck', 'data_preprocessor', 'module')


def _is_entry(node):
    return isinstance(node, dict) and isinstance(node.get('type'), str)


def _items(node, path):
    """(path, entry) of a dict entry or of each entry of a list."""
    if isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            if _is_entry(item):
                yield f'{path}.{i}', item
    elif _is_entry(node):
        yield path, node


def _model_entries(node, path):
    for where, entry in _items(node, path):
        yield where, entry, mmengine_registry.MODELS
        for key, value in entry.items():
            if key in _MODEL_PARTS or str(key).endswith(('head', 'roi_extractor')):
                yield from _model_entries(value, f'{where}.{key}')


def _dataset_entries(node, path):
    for where, entry in _items(node, path):
        yield where, entry, mmengine_registry.DATASETS
        for i, step in enumerate(entry.get('pipeline') or []):
            if _is_entry(step):
                yield f'{where}.pipeline.{i}', step, mmengine_registry.TRANSFORMS
        yield from _dataset_entries(entry.get('dataset'), f'{where}.dataset')
        yield from _dataset_entries(entry.get('datasets'), f'{where}.datasets')


def component_entries(cfg):
    """(config path, entry, root registry) of the component entries :func:`check_config` judges."""
    yield from _model_entries(cfg.get('model'), 'model')
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        loader = cfg.get(key)
        if not isinstance(loader, dict):
            continue
        yield from _dataset_entries(loader.get('dataset'), f'{key}.dataset')
        for name in ('sampler', 'batch_sampler'):
            for where, entry in _items(loader.get(name), f'{key}.{name}'):
                yield where, entry, mmengine_registry.DATA_SAMPLERS
    for name, hook in (cfg.get('default_hooks') or {}).items():
        for where, entry in _items(hook, f'default_hooks.{name}'):
            yield where, entry, mmengine_registry.HOOKS
    for where, entry in _items(cfg.get('custom_hooks'), 'custom_hooks'):
        yield where, entry, mmengine_registry.HOOKS
    for key in ('val_evaluator', 'test_evaluator'):
        for where, entry in _items(cfg.get(key), key):
            if entry['type'] != 'Evaluator':
                yield where, entry, mmengine_registry.METRICS


# keys the Runner takes out of (or passes into) what it builds, per config key
_RUNNER_KEYS = {
    'loop': ('runner', 'dataloader', 'evaluator', 'by_epoch'),
    'optim_wrapper': ('constructor', 'paramwise_cfg'),
    'optimizer': ('params',),
    'param_scheduler': ('optimizer', 'epoch_length', 'convert_to_iter_based'),
    # mmengine's Runner.build_dataloader: taken out, or passed by it, before DataLoader(...)
    'dataloader': ('dataset', 'sampler', 'batch_sampler', 'collate_fn', 'worker_init_fn',
                   'num_batch_per_epoch', 'disable_subprocess_warning'),
}


def runner_entries(cfg, training=True):
    """(config path, entry, root registry or None, class when the entry has no ``type``, keys to leave
    out) of what the Runner builds itself (see the module doc); ``training=False``: only what a test
    run builds (``test_cfg`` and ``test_dataloader``)."""
    from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop, TestLoop, ValLoop
    from torch.utils.data import DataLoader

    loops = (('train_cfg', None), ('val_cfg', ValLoop), ('test_cfg', TestLoop)) if training else \
        (('test_cfg', TestLoop),)
    for key, default in loops:
        loop = cfg.get(key)
        if not isinstance(loop, dict):
            continue
        if default is None and 'type' not in loop:
            default = EpochBasedTrainLoop if loop.get('by_epoch', True) else IterBasedTrainLoop
        yield key, loop, mmengine_registry.LOOPS, default, _RUNNER_KEYS['loop']
    if training:
        wrapper = cfg.get('optim_wrapper')
        if isinstance(wrapper, dict) and isinstance(wrapper.get('optimizer'), dict):  # one optimizer
            from mmengine.optim import OptimWrapper
            yield 'optim_wrapper', wrapper, mmengine_registry.OPTIM_WRAPPERS, OptimWrapper, \
                _RUNNER_KEYS['optim_wrapper']
            if _is_entry(wrapper['optimizer']):
                yield 'optim_wrapper.optimizer', wrapper['optimizer'], mmengine_registry.OPTIMIZERS, None, \
                    _RUNNER_KEYS['optimizer']
        for where, entry in _items(cfg.get('param_scheduler'), 'param_scheduler'):
            yield where, entry, mmengine_registry.PARAM_SCHEDULERS, None, _RUNNER_KEYS['param_scheduler']
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader') if training else ('test_dataloader',):
        loader = cfg.get(key)
        if isinstance(loader, dict):
            yield key, {k: v for k, v in loader.items() if k != 'type'}, None, DataLoader, \
                _RUNNER_KEYS['dataloader']


def accepted_arguments(obj):
    """``(names, complete)``: the keyword arguments ``obj(...)`` accepts (a class: its ``__init__`` and
    those it passes ``**kwargs`` on to with ``super().__init__``, along the MRO; a function: its
    parameters). ``complete`` is False when some ``**kwargs`` go anywhere else (then any other name
    may be accepted)."""
    if not inspect.isclass(obj):
        try:
            params = inspect.signature(obj).parameters.values()
        except (TypeError, ValueError):
            return [], False
        return _names(params), not any(p.kind == p.VAR_KEYWORD for p in params)
    names = []
    for klass in obj.__mro__:
        init = vars(klass).get('__init__')
        if init is None:
            continue
        if klass is object:  # **kwargs that reached object: where they went is unknown
            return names, False
        try:
            params = list(inspect.signature(init).parameters.values())
        except (TypeError, ValueError):
            return names, False
        names += [n for n in _names(params) if n not in names]
        var_keyword = next((p.name for p in params if p.kind == p.VAR_KEYWORD), None)
        if var_keyword is None or klass in _kwargs_take_nothing_more():
            return names, True
        if not _passes_on(init, var_keyword):
            return names, False
    return names, False


def _passes_on(function, name):
    """Whether ``function``'s code calls ``super().__init__(..., **name)``."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == '__init__' \
                and isinstance(node.func.value, ast.Call) and getattr(node.func.value.func, 'id', None) == 'super':
            if any(k.arg is None and isinstance(k.value, ast.Name) and k.value.id == name for k in node.keywords):
                return True
    return False


def _names(params):
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != 'self']


def _registered_names(registry):
    """Names a build in ``registry`` may use: its own and its parents' (the root's)."""
    names, node = set(), registry
    while node is not None:
        names.update(node.module_dict)
        node = node.parent
    return sorted(names)


def _lookup(root, entry):
    """(class or None, the registry of the current scope) for an entry's ``type``."""
    with root.switch_scope_and_registry(entry.get('_scope_')) as registry:
        try:
            return registry.get(entry['type']), registry
        except Exception:  # noqa: BLE001  (an unknown scope prefix: not registered either)
            return None, registry


def _refused_when_built(root, entry, keys):
    """The first of ``keys`` that makes ``entry`` fail to build with a ``TypeError`` (an unexpected
    argument) while it builds without it, on the meta device; None when no key is to blame."""
    def builds(cfg):
        try:
            with torch.device('meta'), root.switch_scope_and_registry(entry.get('_scope_')) as registry:
                registry.build(cfg)
        except TypeError:
            return False
        except Exception:  # noqa: BLE001  (another problem: the Runner reports it)
            return None
        return True

    if builds(dict(entry)) is not False:
        return None
    return next((key for key in keys if builds({k: v for k, v in entry.items() if k != key})), None)


def check_config(cfg, training=True):
    """Raise :class:`UserError` for the first component entry whose ``type`` is registered nowhere
    the builder looks, or that has an argument its class does not take (see the module doc);
    ``training=False`` (a test run): the training loop, optimizer, schedulers and training / validation
    loaders, which a test run does not build, are not judged."""
    for where, entry, root in component_entries(cfg):
        _check_entry(where, entry, root)
    for where, entry, root, default, skip in runner_entries(cfg, training):
        _check_entry(where, entry, root, default, skip)
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader') if training else ('test_dataloader',):
        _check_loader_workers(key, cfg.get(key))
    if training:
        _check_mixup_batches(cfg)


def _check_mixup_batches(cfg):
    """timm's Mixup / CutMix pairs each image with another of its batch (in ``mode='batch'`` the batch with itself
    flipped): it needs even batches, which an odd ``batch_size`` or a kept odd last batch break (a ``ValueError`` of
    the data preprocessor at the first step, or at the end of an epoch)."""
    mixup = (cfg.get('data_preprocessor') or {}).get('mixup')
    loader = cfg.get('train_dataloader')
    if not mixup or not isinstance(loader, dict):
        return
    batch = loader.get('batch_size')
    if isinstance(batch, int) and batch % 2:
        raise UserError(f'train_dataloader.batch_size={batch} with Mixup / CutMix (data_preprocessor.mixup), which '
                        'needs even batches. Fix: an even batch_size (and train_dataloader.drop_last=True)')
    if loader.get('drop_last') is False:
        raise UserError('train_dataloader.drop_last=False with Mixup / CutMix (data_preprocessor.mixup): an odd last '
                        'batch would stop the epoch, as Mixup needs even batches. Fix: train_dataloader.drop_last=True')


def _check_loader_workers(key, loader):
    """Options torch's ``DataLoader`` allows only with worker processes (it raises a ``ValueError`` when the
    Runner builds the loader, after the work dir was made): ``num_workers=0`` (a debugging run of a config whose
    loaders keep their workers) with ``persistent_workers=True`` or a ``prefetch_factor``."""
    if not isinstance(loader, dict) or loader.get('num_workers', 0) != 0:
        return
    for option, off in (('persistent_workers', 'False'), ('prefetch_factor', 'None')):
        if loader.get(option) not in (None, False):
            raise UserError(f'{key}.num_workers=0 with {option}={loader[option]!r}: torch\'s DataLoader allows '
                            f'{option} only with worker processes; set {key}.{option}={off} too, or num_workers '
                            'to 1 or more')


def _check_entry(where, entry, root, default=None, skip=()):
    if default is not None and 'type' not in entry:
        cls, name = default, default.__name__
    else:
        cls, registry = _lookup(root, entry)
        name = entry['type']
        if not isinstance(name, str):  # a class given directly
            cls, name = name, getattr(name, '__name__', str(name))
        if cls is None:
            close = close_matches(name.rpartition('.')[2], _registered_names(registry))
            hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else (
                'no registered name is close; check the spelling, or import the module that registers it '
                "(custom_imports=dict(imports=['...']))")
            raise UserError(f'{where}.type={name!r}: no {registry.name} of that name is registered '
                            f'(scope {registry.scope!r}); {hint}')
    arguments, complete = accepted_arguments(cls)
    arguments = [arg for arg in arguments if arg not in skip]
    unknown = [arg for arg in entry if arg not in _BUILDER_KEYS and arg not in skip and arg not in arguments]
    if not complete:
        unknown = [_refused_when_built(root, entry, unknown)] if unknown and root is mmengine_registry.MODELS \
            and inspect.isclass(cls) and issubclass(cls, torch.nn.Module) else []
    for arg in unknown:
        if arg is None:
            continue
        close = close_matches(str(arg), arguments)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else (
            f"its arguments are {', '.join(arguments)}" if arguments else 'it takes no arguments')
        raise UserError(f'{where}.{arg}: {getattr(cls, "__name__", name)} has no argument {arg!r}; {hint}')


# mmpola's hooks a run should have, where the config lists them, and what each gives
_RUNTIME_HOOKS = (
    ('SafeCheckpointHook', 'default_hooks.checkpoint', True, 'atomic checkpoint saves, a checkpoint on SIGTERM'),
    ('RandomStateHook', 'custom_hooks', True, 'exact resume'),
    ('NonFiniteLossHook', 'custom_hooks', True, 'a clear stop at a NaN / inf loss'),
    ('NonFinitePixelsHook', 'custom_hooks', False, 'a clear stop at an input image with NaN / inf pixels'),
    ('CheckpointFitHook', 'custom_hooks', False, 'refusal of a checkpoint of another model'),
    ('WorkDirHook', 'custom_hooks', True, 'a work dir deleted during the run recreated instead of a crash'),
)


def _hook_name(entry):
    kind = entry.get('type') if isinstance(entry, dict) else entry
    return getattr(kind, '__name__', str(kind)).rpartition('.')[2]


def backbone_implementation_notes(cfg):
    """A note where the config's backbone chooses its linear layers itself (``recompute``), which the run's
    ``op implementations`` line (the environment's choice) does not say."""
    backbone = (cfg.get('model') or {}).get('backbone') or {}
    recompute = backbone.get('recompute') if isinstance(backbone, dict) else None
    if recompute is None:
        return []
    return [f'model.backbone.recompute={recompute!r}: the backbone\'s choice of its linear layers, in place of '
            "MMPOLA_RECOMPUTE's"]


def runtime_hook_notes(cfg, training=True):
    """One note per mmpola hook the config does not use (the tools log them: nothing is added)."""
    present = {_hook_name(h) for h in (cfg.get('custom_hooks') or [])}
    present |= {_hook_name(h) for h in (cfg.get('default_hooks') or {}).values() if h is not None}
    notes = []
    for name, where, train_only, gives in _RUNTIME_HOOKS:
        if name not in present and (training or not train_only):
            notes.append(f'this config has no {name} in {where}, so the run goes without {gives}; the shipped '
                         'configs inherit it from configs/_base_/runtime.py (docs/reliability.md)')
    return notes
