"""What the command-line tools share: config loading, argument and file checks, test-time flags.

The tools serve every task (mmdet, mmseg, classification), so nothing here names a task library
except through the config's ``default_scope``. Errors the user can fix are
:class:`mmpola.errors.MMPolaUserError`; :func:`exit_on_user_error` prints them as one line.
"""
import argparse
import contextlib
import difflib
import importlib
import inspect
import os
import os.path as osp
import re
import sys

from mmengine.config import Config, DictAction

from mmpola.errors import MMPolaUserError, UserError

__all__ = [
    'UserError', 'exit_on_user_error', 'explain_build_error', 'is_url', 'load_config', 'register_task_modules',
    'check_checkpoint_file',
    'check_pretrained_files', 'enable_test_dump', 'enable_tta', 'enable_test_visualization', 'add_launch_args',
    'parse_tool_args', 'set_work_dir', 'build_runner', 'move_data_root',
]


@contextlib.contextmanager
def exit_on_user_error(logger=None):
    """Turn errors the user can fix into one ``error: <message>`` line and the error's exit status.

    Every such error derives from :class:`mmpola.errors.MMPolaUserError` (paths, flags and data,
    refused or mismatched checkpoints, bad backbone arguments, a NaN loss): its message names the
    problem and the fix, a traceback adds noise. With ``logger`` (a running Runner's) the line also
    goes to the run's log file.

    A misspelled ``type`` or argument in the config (mmengine's ``KeyError: '... is not in the ...
    registry'`` or ``TypeError: ... got an unexpected keyword argument``, raised where the Runner
    builds that part) is reported the same way, with the close matches (:func:`explain_build_error`).
    """
    try:
        yield
    except (MMPolaUserError, KeyError, TypeError) as e:
        error = e if isinstance(e, MMPolaUserError) else explain_build_error(e)
        if error is None:
            raise
        if logger is not None:
            logger.error(f'[mmpola] {error}')
        # one write per line: the lines of several processes (one per rank) do not interleave
        sys.stderr.write(f'error: {error}\n')
        sys.stderr.flush()
        sys.exit(error.exit_code)


# what mmengine's build_from_cfg raises for an unknown type, and Python for an unknown argument
_NOT_REGISTERED = re.compile(r"([\w.:-]+) is not in the ([\w-]+)::([\w -]+?) registry")
_UNEXPECTED_ARG = re.compile(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'")


def _built_class(error, arg):
    """The class whose construction from a config entry raised ``error``: the innermost frame of
    mmengine's ``build_from_cfg`` in the traceback whose arguments hold ``arg``; None when the
    error did not come from building a config entry."""
    found, tb = None, error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == 'build_from_cfg' and 'mmengine' in frame.f_code.co_filename:
            args, cls = frame.f_locals.get('args'), frame.f_locals.get('obj_cls')
            if isinstance(args, dict) and arg in args and cls is not None:
                found = cls
        tb = tb.tb_next
    return found


def _registry_names(scope, name):
    """Type names a build in ``scope`` may use for registry ``name`` (``model``, ``dataset`` ...):
    those of the scope's registry and of its parents."""
    import mmengine.registry as mmreg
    roots = [r for r in vars(mmreg).values() if isinstance(r, mmreg.Registry) and r.name == name]
    names, stack = set(), list(roots)
    while stack:
        registry = stack.pop()
        if registry.scope == scope:
            node = registry
            while node is not None:
                names.update(node.module_dict)
                node = node.parent
        stack.extend(registry._children.values())
    if not names:  # the scope was not found: everything registered under that name
        stack = list(roots)
        while stack:
            registry = stack.pop()
            names.update(registry.module_dict)
            stack.extend(registry._children.values())
    return sorted(names)


def _config_paths(cfg, match, where='', limit=3):
    """Config key paths of the dicts for which ``match(dict)`` holds (for the messages)."""
    found = []
    if isinstance(cfg, dict):
        if match(cfg):
            found.append(where or '<config>')
        for key, value in cfg.items():
            found += _config_paths(value, match, f'{where}.{key}' if where else str(key), limit)
    elif isinstance(cfg, (list, tuple)):
        for i, value in enumerate(cfg):
            found += _config_paths(value, match, f'{where}.{i}', limit)
    return found[:limit]


def _init_arguments(cls):
    """Keyword arguments ``cls(...)`` accepts: ``__init__`` parameters along the MRO while they pass
    ``**kwargs`` on."""
    names = []
    for klass in cls.__mro__:
        init = vars(klass).get('__init__')
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            break
        names += [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                  and p.name != 'self' and p.name not in names]
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return names


def _suggest(word, candidates):
    close = difflib.get_close_matches(word, candidates, n=3, cutoff=0.6)
    if not close:
        lowered = {c.lower(): c for c in candidates}
        close = [lowered[c] for c in difflib.get_close_matches(word.lower(), list(lowered), n=3, cutoff=0.6)]
    return close


def explain_build_error(error, cfg=None):
    """A one-line :class:`UserError` for a misspelled ``type`` or argument in a config, with the
    close matches (difflib) among the registered types or the class's arguments, or None when
    ``error`` is something else. ``cfg`` (optional) adds where in the config the name is."""
    msg = str(error)
    if cfg is not None and not isinstance(cfg, dict) and hasattr(cfg, 'to_dict'):
        cfg = cfg.to_dict()  # an mmengine Config
    if isinstance(error, KeyError):
        found = _NOT_REGISTERED.search(msg)
        if found is None:
            return None
        name, scope, registry = found.groups()
        close = _suggest(name, _registry_names(scope, registry))
        where = _config_paths(cfg, lambda d: d.get('type') == name) if cfg is not None else []
        at = f"{where[0]}.type={name!r}" if where else f'type={name!r}'
        hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else (
            'no registered name is close; check the spelling, or import the module that registers it '
            "(custom_imports=dict(imports=['...']))")
        return UserError(f'{at}: no {registry} of that name is registered (scope {scope!r}); {hint}')
    if isinstance(error, TypeError):
        found = _UNEXPECTED_ARG.search(msg)
        cls = _built_class(error, found.group(2)) if found else None
        if cls is None:  # only errors from building a config entry
            return None
        arg, cls_name = found.group(2), getattr(cls, '__name__', str(cls))
        arguments = _init_arguments(cls) if isinstance(cls, type) else []
        close = _suggest(arg, arguments)
        where = _config_paths(cfg, lambda d: arg in d and d.get('type') in (cls_name, cls)) \
            if cfg is not None else []
        at = f'{where[0]}.{arg}: ' if where else ''
        hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else (
            f"its arguments are {', '.join(arguments)}" if arguments else 'check the spelling')
        return UserError(f'{at}{cls_name} has no argument {arg!r}; {hint}')
    return None


def is_url(path):
    return isinstance(path, str) and '://' in path



def load_config(path, cfg_options=None):
    """``Config.fromfile`` with readable errors for a missing file or an absent task library."""
    if not osp.isfile(path):
        raise UserError(f'config file {path!r} does not exist (configs live in configs/detection, '
                        'configs/segmentation, configs/classification and configs/demo)')
    try:
        cfg = Config.fromfile(path)
    except ModuleNotFoundError as e:  # e.g. `mmdet::` bases without mmdet installed
        raise UserError(f'config {path!r} needs the package {e.name!r}, which is not installed; '
                        'see requirements/pins.txt') from e
    if cfg_options:
        if 'data_root' in cfg_options:  # first, so that explicit per-dataset options still win
            move_data_root(cfg, cfg_options['data_root'])
        cfg.merge_from_dict(cfg_options)
    return cfg


_DATA_ROOT_USERS = ('train_dataloader', 'val_dataloader', 'test_dataloader', 'val_evaluator', 'test_evaluator')


def move_data_root(cfg, new_root):
    """``--cfg-options data_root=DIR``: move every dataset and evaluator file that follows the old root.

    A config's top-level ``data_root`` is substituted into ``dataset.data_root`` and the
    evaluators' ``ann_file`` (``data_root + 'annotations/...'``) when the file is parsed, so setting
    it afterwards changes nothing else. Here, in the dataloaders and evaluators, each ``data_root``
    equal to the old root becomes ``new_root`` and each path under the old root is moved under it.
    """
    old_root = cfg.get('data_root')
    if not isinstance(old_root, str) or not old_root.strip('/'):
        raise UserError(f'--cfg-options data_root={new_root}: this config has no top-level data_root to '
                        'replace; set the datasets themselves, e.g. train_dataloader.dataset.data_root=DIR '
                        '(and val_dataloader / test_dataloader, and val_evaluator.ann_file for COCO)')
    old = old_root.rstrip('/')

    def move(node, key=None):
        if isinstance(node, dict):
            for k in node:
                node[k] = move(node[k], k)
        elif isinstance(node, list):
            node[:] = [move(item) for item in node]
        elif isinstance(node, str):
            if key == 'data_root' and node.rstrip('/') == old:
                return new_root
            if node.startswith(old + '/'):
                return osp.join(new_root, node[len(old) + 1:])
        return node

    for key in _DATA_ROOT_USERS:
        if key in cfg and cfg[key] is not None:
            cfg[key] = move(cfg[key])
    cfg.data_root = new_root



def register_task_modules(cfg):
    """Import the task library named by ``default_scope`` and register all its modules.

    mmengine's registries would import most modules lazily, but hooks, visualizers and metrics are
    looked up in places the lazy import does not always reach; ``register_all_modules`` (mmdet,
    mmseg, mmpretrain all provide it) is the libraries' own way to make the registries complete.
    """
    from mmengine.registry import init_default_scope
    scope = cfg.get('default_scope', None) or 'mmengine'
    if scope not in ('mmengine', 'mmpola'):
        try:
            utils = importlib.import_module(f'{scope}.utils')
        except ModuleNotFoundError as e:
            raise UserError(f"the config's default_scope is {scope!r} but {e.name!r} cannot be "
                            'imported; install it (see requirements/pins.txt)') from e
        if hasattr(utils, 'register_all_modules'):
            utils.register_all_modules(init_default_scope=False)
    init_default_scope(scope)
    return scope



def check_checkpoint_file(path, what='checkpoint'):
    """Fail early on a checkpoint path that is missing, a directory, empty or no checkpoint at all
    (:func:`mmpola.checkpoint.safe_load.checkpoint_file_problem`; URLs are checked when downloaded)."""
    if not path or is_url(path):
        return
    if not osp.isfile(path) and not osp.isdir(path):
        raise UserError(f'{what} {path!r} does not exist')
    from mmpola.checkpoint.safe_load import checkpoint_file_problem
    problem = checkpoint_file_problem(path)
    if problem is not None:
        raise problem[0](f'{what}: {problem[1]}')



def _find_pretrained(node, where):
    """Yield (config key path, checkpoint) for every Pretrained init_cfg / pretrained= below node."""
    if isinstance(node, dict):
        if node.get('type') == 'Pretrained' and isinstance(node.get('checkpoint'), str):
            yield where, node['checkpoint']
        for key, value in node.items():
            if key == 'pretrained' and isinstance(value, str):
                yield f'{where}.pretrained', value
            else:
                yield from _find_pretrained(value, f'{where}.{key}')
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _find_pretrained(value, f'{where}.{i}')



def check_pretrained_files(cfg):
    """Fail early (before data loading and model building) on a missing ImageNet checkpoint."""
    from mmpola.checkpoint.safe_load import checkpoint_file_problem
    for where, path in _find_pretrained(cfg.get('model', {}), 'model'):
        if is_url(path):
            continue
        if osp.exists(path):
            problem = checkpoint_file_problem(path)
            if problem is not None:
                raise problem[0](f'pretrained checkpoint ({where}): {problem[1]}')
        else:
            raise UserError(
                f'pretrained checkpoint {path!r} ({where}) does not exist. Put the ImageNet '
                'checkpoint there (official PolaFormer release or our own classification run; see '
                "docs/models.md), or train from random initialisation with "
                f'--cfg-options {where}=None')



def enable_test_dump(cfg, out, scope):
    """``--out``: keep the raw predictions (pickle for mmdet/others, a folder of maps for mmseg)."""
    if scope == 'mmseg':
        cfg.test_evaluator['output_dir'] = out
        cfg.test_evaluator['keep_results'] = True
        return
    if not out.endswith(('.pkl', '.pickle')):
        raise UserError(f'--out {out!r}: the predictions are written as a pickle; use a .pkl name')
    dump = dict(type='DumpDetResults' if scope == 'mmdet' else 'DumpResults', out_file_path=out)
    evaluator = cfg.test_evaluator
    if isinstance(evaluator, (list, tuple)):
        cfg.test_evaluator = list(evaluator) + [dump]
    elif isinstance(evaluator, dict) and 'metrics' in evaluator:
        evaluator['metrics'] = list(evaluator['metrics']) + [dump]
    else:
        cfg.test_evaluator = [evaluator, dump]



def enable_tta(cfg):
    """``--tta``: wrap the model in the config's ``tta_model`` and test with its ``tta_pipeline``."""
    missing = [key for key in ('tta_model', 'tta_pipeline') if key not in cfg]
    if missing:
        raise UserError(f'--tta needs {" and ".join(missing)} in the config (the detection configs inherit '
                        'both from configs/detection/_base_/coco_tta.py, mmseg configs from their dataset and '
                        'runtime bases)')
    dataset = cfg.test_dataloader.dataset
    while 'dataset' in dataset:  # wrapped datasets: the pipeline lives on the innermost one
        dataset = dataset['dataset']
    dataset['pipeline'] = cfg.tta_pipeline
    cfg.model = dict(cfg.tta_model, module=cfg.model)



def enable_test_visualization(cfg, show_dir, scope, show=False, wait_time=2.0):
    """``--show-dir`` / ``--show``: switch the config's visualization hook on."""
    hook = cfg.get('default_hooks', {}).get('visualization')
    if hook is None:
        raise UserError('--show/--show-dir need a `visualization` hook in default_hooks of the config')
    if scope == 'mmpretrain':
        hook['enable'] = True
        if show_dir:
            hook['out_dir'] = show_dir
    else:
        hook['draw'] = True
        if show_dir:
            if scope == 'mmseg':
                cfg.visualizer['save_dir'] = show_dir
            else:  # mmdet: DetVisualizationHook writes one image per test sample there
                hook['test_out_dir'] = osp.abspath(show_dir)
    if show:
        hook['show'] = True
        hook['wait_time'] = wait_time


# --------------------------------------------------------------------------------------------
# the parts of tools/train.py, tools/test.py and the demos that must not drift apart

def add_launch_args(parser):
    """``--cfg-options``, ``--launcher``, ``--device``, ``--local-rank`` (torch.distributed.launch's spelling too)."""
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. train_dataloader.batch_size=4 '
                        'model.backbone.init_cfg=None')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none',
                        help='job launcher (set by tools/dist_*.sh and tools/slurm_*.sh)')
    parser.add_argument('--device', choices=['auto', 'cuda', 'cpu'], default=None,
                        help='auto (default; also MMPOLA_DEVICE): CUDA when usable; a multi-process launch '
                        'without usable CUDA stops with the cause, one process warns and runs on the CPU. '
                        'cpu: run on the CPU on purpose (GPUs hidden). cuda: stop unless CUDA is usable')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0, help=argparse.SUPPRESS)
    return parser


def parse_tool_args(parser, argv=None):
    """Parse, and export ``LOCAL_RANK`` when a launcher passed ``--local-rank`` instead of setting it."""
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(getattr(args, 'local_rank', 0))
    return args


def set_work_dir(cfg, config_path, work_dir=None):
    """``--work-dir`` wins, then the config's ``work_dir``, then ``./work_dirs/<config name>``."""
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(config_path))[0])
    return cfg.work_dir


def build_runner(cfg, launcher='none', notes=()):
    """Start the process group (gloo where mmengine cannot), build the Runner, log ``notes``."""
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    from .launch import init_distributed
    init_distributed(launcher, cfg)
    try:
        runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    except (KeyError, TypeError) as e:  # a misspelled type or argument: name it, with the close matches
        error = explain_build_error(e, cfg)
        if error is None:
            raise
        raise error from e
    for note in notes:
        runner.logger.info(f'[mmpola] {note}')
    return runner
