"""What tools/train.py, tools/test.py and the demos do before handing a config to mmengine's Runner.

The tools serve every task (mmdet, mmseg, classification), so nothing here names a task library
except through the config's ``default_scope``. Three concerns:

* machine fallbacks: the same configs and scripts run on a GPU cluster and on a CPU-only box
  (gloo instead of NCCL, no CUDA device ids for DDP, SyncBN -> BN where it cannot synchronise,
  bf16 autocast instead of CUDA AMP);
* user errors (missing config, checkpoint, dataset) become one clear message instead of a deep
  traceback (:class:`UserError`);
* task adapters for ``--out`` / ``--show-dir``, whose config keys differ between mmdet and mmseg.
"""
import contextlib
import importlib
import inspect
import json
import mmap
import os
import os.path as osp
import re
import subprocess
import sys
from datetime import timedelta

import torch
from mmengine.config import Config

__all__ = [
    'UserError', 'exit_on_user_error', 'load_config', 'register_task_modules', 'adapt_cfg_to_machine',
    'setup_amp', 'init_distributed', 'check_checkpoint_file', 'check_pretrained_files', 'check_data_files',
    'check_dataset_images', 'coco_image_file_names',
    'enable_test_dump', 'enable_test_visualization', 'enable_tta', 'replace_sync_bn', 'is_url',
]

# Types mmcv registers for synchronised batch norm (torch's and mmcv's own implementation).
_SYNC_BN_TYPES = ('SyncBN', 'MMSyncBN', 'TorchSyncBN')


class UserError(Exception):
    """A problem the user can fix (a path, a flag); the tools print it without a traceback."""


@contextlib.contextmanager
def exit_on_user_error():
    """Turn errors the user can fix into ``error: <message>`` on stderr and exit status 2.

    They are :class:`UserError` (paths, flags, data), a refused checkpoint (``UnsafeCheckpointError``),
    a checkpoint of another model (``CheckpointMismatchError``) and bad backbone arguments or input
    sizes (``PolaConfigError``): their messages name the problem and the fix, a traceback adds noise.
    """
    from mmpola.checkpoint import CheckpointMismatchError
    from mmpola.models.utils import PolaConfigError
    from mmpola.safe_load import UnsafeCheckpointError
    try:
        yield
    except (UserError, UnsafeCheckpointError, CheckpointMismatchError, PolaConfigError) as e:
        print(f'error: {e}', file=sys.stderr, flush=True)
        sys.exit(2)


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
        cfg.merge_from_dict(cfg_options)
    return cfg


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


def replace_sync_bn(node):
    """Rewrite every ``type='SyncBN'``-like norm config below ``node`` to plain ``BN`` (in place)."""
    count = 0
    if isinstance(node, dict):
        if node.get('type') in _SYNC_BN_TYPES:
            node['type'] = 'BN'
            count += 1
        for value in node.values():
            count += replace_sync_bn(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            count += replace_sync_bn(value)
    return count


def adapt_cfg_to_machine(cfg, launcher='none'):
    """Make a cluster config run here: returns a list of human-readable notes on what changed.

    * no CUDA: the process group uses gloo, DDP gets no CUDA ``device_ids``, CUDA AMP becomes
      bf16 autocast on the CPU (:class:`mmpola.engine.BF16AmpOptimWrapper`);
    * one process, or no GPU: SyncBN cannot synchronise anything (and has no CPU kernel), so
      ``SyncBN`` norm configs become ``BN`` and ``sync_bn`` conversion is dropped. mmengine
      reverts SyncBN layers for single-process runs too, but only after building; rewriting the
      config also makes the dumped config tell the truth.
    """
    notes = []
    cuda = torch.cuda.is_available()
    distributed = launcher != 'none'
    cfg.launcher = launcher
    if not cuda:
        env_cfg = cfg.setdefault('env_cfg', {})
        dist_cfg = env_cfg.setdefault('dist_cfg', {})
        if dist_cfg.get('backend', 'nccl') != 'gloo':
            dist_cfg['backend'] = 'gloo'
            notes.append('no CUDA device: distributed backend set to gloo')
        env_cfg['cudnn_benchmark'] = False
        if distributed:
            wrapper = cfg.get('model_wrapper_cfg') or dict(
                type='MMDistributedDataParallel', broadcast_buffers=False,
                find_unused_parameters=cfg.get('find_unused_parameters', False))
            wrapper['device_ids'] = None  # DDP refuses CUDA device ids for a CPU module
            cfg.model_wrapper_cfg = wrapper
        optim_wrapper = cfg.get('optim_wrapper')
        if isinstance(optim_wrapper, dict) and optim_wrapper.get('type') == 'AmpOptimWrapper':
            _to_bf16_amp(cfg, optim_wrapper)
            notes.append('no CUDA device: AMP runs as bf16 autocast of the backbone on the CPU')
    if not cuda or not distributed:
        count = replace_sync_bn(cfg.get('model', {}))
        if count:
            why = 'no CUDA device' if not cuda else 'single process'
            notes.append(f'{why}: {count} SyncBN norm config(s) replaced by BN')
        if cfg.get('sync_bn') is not None:
            cfg.pop('sync_bn')
            notes.append('sync_bn conversion dropped (nothing to synchronise)')
    return notes


def _to_bf16_amp(cfg, optim_wrapper):
    optim_wrapper['type'] = 'BF16AmpOptimWrapper'
    # the dumped config must find the wrapper again when it is reloaded on its own
    custom_imports = cfg.setdefault('custom_imports', dict(imports=[], allow_failed_imports=False))
    if 'mmpola.engine' not in custom_imports['imports']:
        custom_imports['imports'] = list(custom_imports['imports']) + ['mmpola.engine']
    optim_wrapper['dtype'] = 'bfloat16'
    optim_wrapper.pop('loss_scale', None)  # bf16 keeps fp32's exponent range: no loss scaling
    optim_wrapper.pop('use_fsdp', None)


def setup_amp(cfg, dtype=None):
    """Switch the optimizer wrapper to mixed precision (``--amp``).

    CUDA, fp16 (default): mmengine's ``AmpOptimWrapper`` with dynamic loss scaling over the whole
    model. bf16 (the CPU's only choice, or ``dtype='bfloat16'`` on CUDA):
    :class:`mmpola.engine.BF16AmpOptimWrapper`, which autocasts the backbone, because mmcv's
    detection kernels do not take bf16. The Pola attention core computes in fp32 either way.
    """
    optim_wrapper = cfg.optim_wrapper
    if optim_wrapper.get('type', 'OptimWrapper') not in ('OptimWrapper', 'AmpOptimWrapper',
                                                         'BF16AmpOptimWrapper'):
        raise UserError(f"--amp cannot wrap optim_wrapper type {optim_wrapper['type']!r}")
    if torch.cuda.is_available() and dtype in (None, 'float16'):
        optim_wrapper['type'] = 'AmpOptimWrapper'
        optim_wrapper.setdefault('loss_scale', 'dynamic')
        optim_wrapper['dtype'] = 'float16'
        return 'AMP: float16 autocast on CUDA with dynamic loss scaling'
    if dtype == 'float16':
        raise UserError('--amp-dtype float16 needs a CUDA device; on the CPU --amp uses bfloat16')
    _to_bf16_amp(cfg, optim_wrapper)
    return f"AMP: bfloat16 autocast of the backbone on {'CUDA' if torch.cuda.is_available() else 'the CPU'}"


def init_distributed(launcher, cfg):
    """Start the process group on CPU-only machines, where mmengine's ``init_dist`` cannot.

    mmengine's launch functions call ``torch.cuda.set_device`` unconditionally; without a GPU we
    initialise gloo ourselves from the variables torchrun or slurm set, and mmengine then finds
    the group ready. With CUDA this does nothing and mmengine starts NCCL as usual.
    """
    import torch.distributed as dist
    if launcher == 'none' or torch.cuda.is_available() or dist.is_initialized():
        return
    timeout = cfg.get('env_cfg', {}).get('dist_cfg', {}).get('timeout', 1800)
    if launcher == 'pytorch':
        missing = [k for k in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT') if k not in os.environ]
        if missing:
            raise UserError(f'--launcher pytorch expects torchrun to set {", ".join(missing)}; '
                            'start it with tools/dist_train.sh or tools/dist_test.sh')
    elif launcher == 'slurm':
        os.environ['RANK'] = os.environ['SLURM_PROCID']
        os.environ['WORLD_SIZE'] = os.environ['SLURM_NTASKS']
        os.environ['LOCAL_RANK'] = os.environ.get('SLURM_LOCALID', '0')
        if 'MASTER_ADDR' not in os.environ:
            node_list = os.environ['SLURM_NODELIST']
            os.environ['MASTER_ADDR'] = subprocess.getoutput(
                f'scontrol show hostname {node_list} | head -n1').strip()
        os.environ.setdefault('MASTER_PORT', '29500')
    else:
        raise UserError(f'--launcher {launcher} needs CUDA; on CPU use pytorch (tools/dist_*.sh) or slurm')
    dist.init_process_group(backend='gloo', timeout=timedelta(seconds=timeout))


def check_checkpoint_file(path, what='checkpoint'):
    if path and not is_url(path) and not osp.isfile(path):
        raise UserError(f'{what} {path!r} does not exist')


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
    for where, path in _find_pretrained(cfg.get('model', {}), 'model'):
        if not is_url(path) and not osp.isfile(path):
            raise UserError(
                f'pretrained checkpoint {path!r} ({where}) does not exist. Put the ImageNet '
                'checkpoint there (official PolaFormer release or our own classification run; see '
                "README 'Pretrained backbones'), or train from random initialisation with "
                f'--cfg-options {where}=None')


def _dataset_cfgs(node):
    """The leaf dataset configs of a (possibly wrapped: RepeatDataset, ConcatDataset ...) dataset."""
    if not isinstance(node, dict):
        return
    inner = node.get('dataset', None)
    inners = node.get('datasets', None)
    if isinstance(inner, dict):
        yield from _dataset_cfgs(inner)
    elif isinstance(inners, (list, tuple)):
        for item in inners:
            yield from _dataset_cfgs(item)
    else:
        yield node


_DATA_HINTS = {
    'CocoDataset': 'for COCO 2017, put annotations/instances_{train,val}2017.json, train2017/ and '
                   'val2017/ under data/coco/ (or symlink data/coco to your copy)',
    'ADE20KDataset': 'for ADE20K put ADEChallengeData2016/ (images/ and annotations/) under data/ade/',
}


def check_data_files(cfg, dataloader_keys, check_images=True):
    """Fail early with a hint when a dataset root, annotation file, image folder or image is missing.

    A config may carry ``data_hint='...'`` (e.g. the command that generates its demo data); it
    is shown first. With ``check_images`` (the default) every file the dataset will read is
    stat'ed too (:func:`check_dataset_images`), so that a missing or empty image is reported here,
    naming the files, rather than as an exception inside a DataLoader worker hours into a run.
    """
    for key in dataloader_keys:
        loader = cfg.get(key)
        if not isinstance(loader, dict):
            continue
        for dataset in _dataset_cfgs(loader.get('dataset')):
            root = dataset.get('data_root') or ''
            paths = [('data_root', root)] if root else []
            ann_file = dataset.get('ann_file')
            if ann_file:
                paths.append(('ann_file', ann_file if osp.isabs(ann_file) else osp.join(root, ann_file)))
            prefix = dataset.get('data_prefix') or {}
            for name, value in (prefix.items() if isinstance(prefix, dict) else []):
                if isinstance(value, str) and value and not is_url(value):
                    paths.append((f'data_prefix.{name}', value if osp.isabs(value) else osp.join(root, value)))
            for name, path in paths:
                if is_url(path) or osp.exists(path):
                    continue
                raise UserError(
                    f'{key}: {name} {path!r} does not exist. ' + _data_hint(cfg, dataset)
                    + f'Or point the config at your copy: --cfg-options {key}.dataset.data_root=DIR')
            if check_images:
                check_dataset_images(dataset, key, hint=_data_hint(cfg, dataset))


def _data_hint(cfg, dataset):
    hint = cfg.get('data_hint') or _DATA_HINTS.get(dataset.get('type'), '')
    return f'{hint[0].upper()}{hint[1:]}. ' if hint else ''


# how many offending paths an error message lists
_SHOW_PATHS = 5


def _dataset_class(dataset_type):
    """The class the Runner would build for ``type`` (looked up as the builder does: in the
    registry of the current default scope), or None."""
    if isinstance(dataset_type, type):
        return dataset_type
    if not isinstance(dataset_type, str):
        return None
    try:
        from mmengine.registry import DATASETS
        with DATASETS.switch_scope_and_registry(None) as registry:
            cls = registry.get(dataset_type)
    except Exception:  # an unknown scope or type: the Runner will report it
        return None
    return cls if isinstance(cls, type) else None


def _defining_class(dataset_type, method):
    """Name of the class whose ``method`` the dataset type uses (registry lookup, MRO), or None."""
    cls = _dataset_class(dataset_type)
    if cls is None:
        return None
    owner = next((c for c in cls.__mro__ if method in vars(c)), None)
    return owner.__name__ if owner is not None else None


def _init_default(dataset_type, name, fallback):
    """Default of ``name`` in the dataset class' ``__init__`` (e.g. ADE20KDataset's suffixes)."""
    cls = _dataset_class(dataset_type)
    for c in (cls.__mro__ if cls is not None else ()):
        param = inspect.signature(c.__init__).parameters.get(name)
        if param is not None and param.default is not inspect.Parameter.empty:
            return param.default
    return fallback


def coco_image_file_names(ann_file):
    """``images[*].file_name`` of a COCO annotation file, quickly.

    ``json.load`` of a file the size of COCO's instances_train2017.json (~450 MB) takes ~30 s
    and GBs of memory; the ``images`` array (118k entries, ~30 MB) comes before the annotations
    in COCO-format files, so only it is decoded, from a memory map (~0.5 s). Files laid out
    otherwise fall back to a full parse.
    """
    try:
        with open(ann_file, 'rb') as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise UserError(f'annotation file {ann_file!r} is empty (0 bytes): an interrupted '
                                'download or copy; replace it with the original file')
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                images = _decode_images_array(mm)
                if images is None:
                    images = json.loads(mm[:].decode('utf-8')).get('images', [])
    except (ValueError, AttributeError) as e:  # JSONDecodeError, UnicodeDecodeError, not an object
        raise UserError(f'annotation file {ann_file!r} is not a COCO-format JSON file ({e}); '
                        'replace it with the original file') from e
    if not isinstance(images, list):
        raise UserError(f"annotation file {ann_file!r}: 'images' is not a list")
    return [img['file_name'] for img in images if isinstance(img, dict) and 'file_name' in img]


def _decode_images_array(mm):
    match = re.search(rb'"images"\s*:\s*\[', mm)  # only a key can be followed by ':'
    if match is None:
        return None
    start, size, decoder = match.end() - 1, 1 << 25, json.JSONDecoder()
    while True:
        chunk = mm[start:start + size].decode('utf-8', 'replace')  # a cut character: only at the end
        try:
            images, _ = decoder.raw_decode(chunk)  # a cut-off array is never valid JSON
        except json.JSONDecodeError:
            if start + size >= len(mm):
                return None
            size *= 4
            continue
        ok = all(isinstance(img, dict) and 'file_name' in img for img in images[:100])
        return images if ok else None


def _seg_dataset_files(dataset, root):
    """(images, seg maps) an mmseg BaseSegDataset would list: images found under ``img_path`` by
    suffix (or named by ``ann_file``, one stem per line), each with its map under ``seg_map_path``."""
    def full(path):
        return path if osp.isabs(path) else osp.join(root, path)

    prefix = dataset.get('data_prefix') or {}
    img_dir = full(prefix.get('img_path', '') or '')
    seg_dir = prefix.get('seg_map_path')
    seg_dir = full(seg_dir) if seg_dir else None
    img_suffix = dataset.get('img_suffix') or _init_default(dataset.get('type'), 'img_suffix', '.jpg')
    seg_suffix = dataset.get('seg_map_suffix') or _init_default(dataset.get('type'), 'seg_map_suffix', '.png')
    ann_file = dataset.get('ann_file') or ''
    if ann_file and not osp.isdir(full(ann_file)):
        with open(full(ann_file)) as f:
            stems = [line.strip() for line in f if line.strip()]
    else:
        stems = []
        for dirpath, _, files in os.walk(img_dir, followlinks=True):
            rel = osp.relpath(dirpath, img_dir)
            stems += [osp.normpath(osp.join(rel, name))[:-len(img_suffix)]
                      for name in files if name.endswith(img_suffix)]
        if not stems:
            raise UserError(f'no {img_suffix!r} images under {img_dir!r}')
        stems.sort()
    images = [osp.join(img_dir, stem + img_suffix) for stem in stems]
    seg_maps = [osp.join(seg_dir, stem + seg_suffix) for stem in stems] if seg_dir else []
    return images, seg_maps


def _missing_and_empty(paths):
    missing, empty = [], []
    for path in paths:
        try:
            if os.stat(path).st_size == 0:
                empty.append(path)
        except (FileNotFoundError, NotADirectoryError):
            missing.append(path)
    return missing, empty


def _listing(paths):
    shown = ''.join(f'\n  {path}' for path in paths[:_SHOW_PATHS])
    more = len(paths) - _SHOW_PATHS
    return shown + (f'\n  ... and {more} more' if more > 0 else '')


def check_dataset_images(dataset, key='dataset', hint=''):
    """Stat every image (and segmentation map) a dataset config will read; raise :class:`UserError`
    with the count, the first paths and the fix when some are missing or empty (0 bytes).

    Understood: mmdet's COCO-format datasets (``images[*].file_name`` of ``ann_file`` under
    ``data_prefix.img``) and mmseg's folder datasets (images by suffix under
    ``data_prefix.img_path``, maps under ``seg_map_path``). Other datasets, and files read through
    a remote ``backend_args``, are left to the dataset. One ``stat`` per file: COCO train2017
    (118k images) takes well under a second on a local disk.
    """
    if dataset.get('backend_args') or is_url(dataset.get('data_root')):
        return
    root = dataset.get('data_root') or ''
    prefix = dataset.get('data_prefix') or {}
    if not isinstance(prefix, dict):
        return
    dataset_type = dataset.get('type')
    loader_owner = _defining_class(dataset_type, 'parse_data_info')
    if loader_owner == 'CocoDataset' or (loader_owner is None and dataset_type == 'CocoDataset'):
        ann_file = dataset.get('ann_file')
        if not ann_file or is_url(prefix.get('img', '')):
            return
        ann_file = ann_file if osp.isabs(ann_file) else osp.join(root, ann_file)
        img_dir = prefix.get('img', '') or ''
        img_dir = img_dir if osp.isabs(img_dir) else osp.join(root, img_dir)
        images = [osp.join(img_dir, name) for name in coco_image_file_names(ann_file)]
        groups = [('images', images, f'listed in {ann_file!r}',
                   f'restore them, or remove their entries from {ann_file!r}')]
    elif _defining_class(dataset_type, 'load_data_list') == 'BaseSegDataset':
        if any(is_url(v) for v in prefix.values()):
            return
        images, seg_maps = _seg_dataset_files(dataset, root)
        groups = [('images', images, 'the dataset lists', 'restore them')]
        if seg_maps:
            groups.append(('segmentation maps', seg_maps, 'of the images under '
                           f"{dataset['data_prefix']['img_path']!r} (one per image, same name)",
                           'add the missing maps, or move the images that have none out of the image folder'))
    else:
        return
    for what, paths, source, fix in groups:
        missing, empty = _missing_and_empty(paths)
        if missing:
            raise UserError(
                f'{key}: {len(missing)} of {len(paths)} {what} {source} do not exist:{_listing(missing)}'
                f'\nFix: {fix}. {hint}'.rstrip())
        if empty:
            raise UserError(
                f'{key}: {len(empty)} of {len(paths)} {what} {source} are empty (0 bytes: an interrupted '
                f'download or copy):{_listing(empty)}\nFix: replace them with the original files. {hint}'.rstrip())


# --------------------------------------------------------------------------------------------
# task adapters for test-time flags: the config keys differ between the OpenMMLab libraries

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
        raise UserError(f'--tta needs {" and ".join(missing)} in the config (mmseg configs inherit both '
                        'from their dataset and runtime bases)')
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
