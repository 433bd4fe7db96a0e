"""Configs as the tools load them: the file, ``--cfg-options`` (with ``data_root``), the task library,
the work dir."""
import importlib
import json
import os
import os.path as osp
import pkgutil
import re
import sys

from mmengine.config import Config

from mmpola.config_scope import PACKAGE
from mmpola.errors import UserError, close_matches

__all__ = ['is_url', 'check_config_file', 'check_option_keys', 'config_dicts', 'known_top_level_keys', 'load_config',
           'move_data_root', 'register_task_modules', 'set_work_dir']


def config_dicts(node):
    """Every dict below ``node`` (a config or a part of it), ``node`` itself first, through nested dicts, lists and
    tuples: where a config's entries of some type are found and changed in place."""
    if isinstance(node, dict):
        yield node
        for value in list(node.values()):
            yield from config_dicts(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from config_dicts(value)


def is_url(path):
    return isinstance(path, str) and '://' in path


def check_config_file(path):
    """:class:`UserError` naming ``path`` when no config file is there, with the files of the same folder whose
    names are close. The tools ask it first, before they decide the device (whose warning would otherwise come
    before the error that stops the run)."""
    if osp.isfile(path):
        return
    folder, name = osp.split(path)
    close = _close_files(folder, name)
    if close:
        raise UserError(f"config file {path!r} does not exist; did you mean "
                        f"{' or '.join(repr(osp.join(folder, n)) for n in close)}?")
    raise UserError(f'config file {path!r} does not exist (configs live in configs/detection, '
                    'configs/segmentation, configs/classification and configs/demo)')


def load_config(path, cfg_options=None):
    """``Config.fromfile`` with readable errors for a missing file or an absent task library.

    The config's text (``pretty_text``: the log's copy, the one written to the work dir, each checkpoint's) is
    mmengine's without yapf's formatting (``format_python_code=False``): the same Python, one item per line,
    which yapf would otherwise format anew for each copy (four at the start of a run, one per checkpoint)."""
    check_config_file(path)
    try:
        cfg = Config.fromfile(path, format_python_code=False)
    except ModuleNotFoundError as e:  # e.g. `mmdet::` bases without mmdet installed
        raise UserError(f'config {path!r} needs the package {e.name!r}, which is not installed; '
                        'see requirements/pins.txt') from e
    except ImportError as e:  # mmengine's wrapper of a failed custom_imports module
        failed = _failed_custom_import(path, e)
        if failed is None:
            raise
        raise UserError(f'config {path!r} {failed}') from e
    except (SyntaxError, FileNotFoundError, TypeError, KeyError) as e:
        unreachable = _unreachable_package_configs(path, e)
        if unreachable:
            raise UserError(f'config {path!r} {unreachable}') from e
        if not _raised_reading_the_config(e):  # e.g. raised by a module of its custom_imports
            raise
        raise UserError(f'config {path!r} {_reading_problem(e)}') from e
    if getattr(cfg, '_format_python_code', False):  # mmengine passes the option on for lazy-import configs only
        cfg = Config(cfg.to_dict(), cfg_text=cfg.text, filename=cfg.filename, env_variables=cfg.env_variables,
                     format_python_code=False)
    if cfg_options:
        check_option_keys(cfg, cfg_options)
        if 'data_root' in cfg_options:  # first, so that explicit per-dataset options still win
            move_data_root(cfg, cfg_options['data_root'])
        cfg.merge_from_dict(cfg_options)
    return cfg


def known_top_level_keys():
    """Top-level config keys something reads without the configs defining them: the Runner's arguments and
    mmpola's own options."""
    import inspect

    from mmengine.runner import Runner

    from .options import RUN_OPTIONS
    return set(inspect.signature(Runner.__init__).parameters) - {'self'} | set(RUN_OPTIONS) | {'data_root',
                                                                                              'runner_type'}


def check_option_keys(cfg, cfg_options):
    """:class:`UserError` for a ``--cfg-options`` key whose first part is no key of the config, nor one read without
    it (:func:`known_top_level_keys`), but close to one of those: ``data_roott=...`` would add a key that nothing
    reads, and the run would go on without the option. A new key far from every known one is added as given."""
    known = set(cfg) | known_top_level_keys()
    for key in cfg_options:
        top = key.split('.', 1)[0]
        if top not in known:
            close = close_matches(top, sorted(known), cutoff=0.8)
            if close:
                raise UserError(f"--cfg-options {key}: the config has no {top!r}, so the option would add a key "
                                f"that nothing reads; did you mean {' or '.join(repr(c) for c in close)}?")
        _check_option_path(cfg, key, cfg_options)


def _check_option_path(cfg, key, cfg_options):
    """A key below an entry the config sets to None (``model.backbone.init_cfg.checkpoint=X`` where
    ``init_cfg=None``): mmengine's merge stops with a ``TypeError``; say which entry and how to give it whole."""
    parts = key.split('.')
    node = cfg
    for i, part in enumerate(parts[:-1]):
        if not isinstance(node, (dict, Config)) or part not in node:
            return
        node = node[part]
        entry = '.'.join(parts[:i + 1])
        if node is None and f'{entry}._delete_' not in cfg_options:
            raise UserError(f'--cfg-options {key}: {entry} is None in the config, so it has no key '
                            f'{parts[i + 1]!r} to set; give the whole entry: --cfg-options {entry}._delete_=True '
                            f'{key}=... and its other keys (e.g. {entry}.type=...)')


def _reading_problem(error):
    """What mmengine's reading of a config's files met (:func:`load_config`), and the fix, in words."""
    if isinstance(error, SyntaxError):  # the file or one it inherits from (mmengine parses some without their name)
        where = error.filename if error.filename and not error.filename.startswith('<') else \
            'it or a file it inherits from'
        return f'is not valid Python ({where}, line {error.lineno}: {error.msg}); fix that line'
    if isinstance(error, FileNotFoundError):  # a file in its _base_ list
        return _missing_base(error)
    # mmengine's merge of a config into its bases (TypeError), a missing base variable (KeyError)
    detail = str(error.args[0]) if error.args else repr(error)
    if isinstance(error, KeyError) and ' ' not in detail:  # a name: `_base_.NAME` / `{{_base_.NAME}}` missing
        detail = f'it uses {detail!r}, which the configs it inherits from do not define'
    return f'does not fit the configs it inherits from: {detail}'


def _failed_custom_import(path, error):
    """What failed in the config's ``custom_imports``, and the fix, from mmengine's ``ImportError`` (whose own
    message lists ``sys.path``), else None: a module that cannot be found, or one that is found but fails itself
    (then its own error and where it was raised)."""
    failed = error.__cause__  # mmengine's "Failed to import NAME", raised while the module's own error was handled
    if not str(error).startswith('Failed to import custom modules') or not isinstance(failed, ImportError) \
            or not str(failed).startswith('Failed to import '):
        return None
    name = str(failed)[len('Failed to import '):]
    cause = failed.__context__
    if not isinstance(cause, ImportError):
        return None
    if isinstance(cause, ModuleNotFoundError) and cause.name and (name == cause.name or
                                                                  name.startswith(cause.name + '.')):
        return _missing_module(path, name, cause.name)
    where = _where_raised(cause)
    return (f'imports the module {name!r} (custom_imports), which is found but fails to import: '
            f'{type(cause).__name__}: {cause}{where}; fix that import in the module (or install what it needs)')


def _missing_module(path, name, missing):
    """The message for a ``custom_imports`` module ``name`` that cannot be found (``missing``: it, or the package
    above it that is missing): a module of that name in the config's folder or the working directory, which are not
    on Python's path, or the close names, and the fix."""
    text = f'imports the module {name!r} (custom_imports), which cannot be found (no module named {missing!r})'
    on_path = {osp.realpath(p or '.') for p in sys.path}
    folders = [f for f in dict.fromkeys((osp.dirname(osp.abspath(path)), os.getcwd()))
               if osp.realpath(f) not in on_path]
    parent, _, last = missing.rpartition('.')
    local = {} if parent else {m.name: folder for folder in reversed(folders) for m in pkgutil.iter_modules([folder])}
    if missing in local:
        folder = '.' if osp.realpath(local[missing]) == osp.realpath(os.getcwd()) else local[missing]
        return (f"{text}: there is one in {local[missing]}, which is not on Python's path. Fix: put that folder on "
                f'PYTHONPATH, e.g. PYTHONPATH={folder} tools/train.py CONFIG')
    if parent:
        try:
            candidates = [m.name for m in pkgutil.iter_modules(importlib.import_module(parent).__path__)]
        except (ImportError, AttributeError):
            candidates = []
    else:
        tools = osp.realpath(osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'tools'))
        searched = [p for p in sys.path if p and osp.realpath(p) != tools]  # the tools' folder: scripts, no modules
        candidates = sorted(set(local) | {m.name for m in pkgutil.iter_modules(searched)})
        candidates = [c for c in candidates if not c.startswith('_') or last.startswith('_')]
    close = close_matches(last, candidates)[:1]
    if close:
        where = f" (in {local[close[0]]}, not on Python's path)" if close[0] in local else ''
        text += f"; did you mean {(f'{parent}.' if parent else '') + close[0]!r}{where}?"
    else:
        text += '.'
    return (f'{text} Fix: check the name; a module of your own must be importable: its folder on PYTHONPATH, '
            'e.g. PYTHONPATH=. tools/train.py CONFIG from the folder that holds it')


def _where_raised(error):
    """`` (FILE, line N)`` of the last frame of ``error``'s traceback in a real file, or ''."""
    found, traceback = '', error.__traceback__
    while traceback is not None:
        filename = traceback.tb_frame.f_code.co_filename
        if not filename.startswith('<'):
            found = f' ({filename}, line {traceback.tb_lineno})'
        traceback = traceback.tb_next
    return found


def _unreachable_package_configs(path, error):
    """Why ``mmpola::`` bases cannot be read, and the fix, when mmengine looked for mmpola's configs in another
    folder than the package's (``error``: the ``FileNotFoundError`` of ``<site-packages>/mmpola/.mim/...``),
    else None.

    mmengine takes a package's folder from its installed distribution (the metadata's location), which for an
    editable install is not where the package is: it finds neither ``.mim/model-index.yml`` nor the configs."""
    filename = getattr(error, 'filename', None)
    marker = f'{os.sep}{PACKAGE}{os.sep}.mim{os.sep}'
    if not isinstance(filename, str) or marker not in filename:
        return None
    looked_in = filename[:filename.index(marker)] + os.sep + PACKAGE
    package = osp.dirname(osp.dirname(osp.abspath(__file__)))
    if osp.realpath(looked_in) == osp.realpath(package):  # the installed package itself lacks the file
        return None
    configs = osp.realpath(osp.join(package, '.mim', 'configs'))
    if not osp.isdir(configs):
        configs = osp.join(osp.dirname(package), 'configs')
    with open(path, encoding='utf-8', errors='replace') as f:
        named = re.search(rf"{PACKAGE}::([^'\"\s]+)", f.read())
    base = named.group(1) if named else 'detection/....py'
    absolute = osp.join(configs, base)
    relative = osp.relpath(absolute, osp.dirname(osp.abspath(path)))
    install = ('this environment has an editable install (pip install -e .)' if _editable_install()
               else 'the mmpola imported here is not an installed package')
    return (f"inherits {PACKAGE}::{base if named else '...'}, but mmengine resolves {PACKAGE}:: bases only for an "
            f'installed mmpola (pip install ., not -e) and {install}: mmengine looks for the configs in '
            f'{osp.join(looked_in, ".mim")}, the package is {package}. Fix: name the base by its path, '
            f'_base_ = [{absolute!r}] (a path relative to the config also works: {relative!r}), or install mmpola '
            'with pip install . (docs/install.md, "Into your own environment")')


def _editable_install():
    """Whether the installed distribution of mmpola is an editable one (pip's ``direct_url.json``)."""
    from importlib import metadata
    try:
        direct_url = json.loads(metadata.distribution(PACKAGE).read_text('direct_url.json') or '{}')
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return bool(direct_url.get('dir_info', {}).get('editable'))


def _close_files(folder, name):
    """The files of ``folder`` whose names are close to ``name`` (none when the folder does not exist either)."""
    try:
        siblings = [n for n in os.listdir(folder or '.') if osp.isfile(osp.join(folder or '.', n))]
    except OSError:
        siblings = []
    return close_matches(name, siblings)


def _missing_base(error):
    """A ``_base_`` file that does not exist (mmengine's ``FileNotFoundError``: an ``OSError``'s filename, or its
    ``check_file_exist`` message for a ``pkg::`` base), named as the config names it, with the close files."""
    path = error.filename
    if path is None:
        found = re.match(r'file "(.+)" does not exist', str(error))
        path = found.group(1) if found else str(error)
    folder, name = osp.split(path)
    scoped = re.match(r'.*/([^/]+)/\.mim/configs/(.+)$', path)  # mmdet::pvt/x.py from .../mmdet/.mim/configs/pvt/x.py

    def shown(file):
        full = osp.join(folder, file)
        return f'{scoped.group(1)}::{osp.relpath(full, path[:-len(scoped.group(2))])}' if scoped else osp.normpath(full)

    close = _close_files(folder, name)
    hint = f" (did you mean {' or '.join(repr(shown(n)) for n in close)}?)" if close else ''
    return (f'inherits from {shown(name)!r}, which does not exist{hint}; fix its _base_ list (paths are relative to '
            "the config, or mmdet:: / mmseg:: for the libraries' configs)")


def _raised_reading_the_config(error):
    """Whether ``error`` comes from mmengine's reading of the config files (its last frame in mmengine's config
    module, or a syntax error of a file it parsed), not from code the config imports."""
    if isinstance(error, SyntaxError) and error.__traceback__ is not None and error.filename in (None, '<unknown>'):
        return True
    files = []
    traceback = error.__traceback__
    while traceback is not None:
        files.append(traceback.tb_frame.f_code.co_filename)
        traceback = traceback.tb_next
    if not files:
        return False
    if osp.dirname(files[-1]) == _MMENGINE_CONFIG_DIR:
        return True
    # a missing `pkg::` base: mmengine's config module asks its check_file_exist
    return isinstance(error, FileNotFoundError) and len(files) > 1 and \
        osp.dirname(files[-2]) == _MMENGINE_CONFIG_DIR and files[-1] == _MMENGINE_PATH_UTILS


_MMENGINE_CONFIG_DIR = osp.dirname(sys.modules[Config.__module__].__file__)
_MMENGINE_PATH_UTILS = importlib.import_module('mmengine.utils.path').__file__


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


def set_work_dir(cfg, config_path, work_dir=None):
    """``--work-dir`` wins, then the config's ``work_dir``, then ``./work_dirs/<config name>``."""
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(config_path))[0])
    return cfg.work_dir
