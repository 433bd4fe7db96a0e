"""``python tools/benchmark.py train``: training throughput of whole configs (this module holds its
implementation; run it through tools/benchmark.py).

Each config is built as tools/train.py builds it (mmpola's config loading, the task library's
modules, ``--amp``, the machine's fallbacks, the config check, the Runner with the config's model,
optimizer wrapper, parameter schedulers and hooks), with these changes, the same for every config:

* data: generated, in the layout of the config's dataset (COCO-format instances of the dataset's own
  classes for mmdet configs, made by :func:`mmpola.datasets.make_demo_coco`: COCO-sized images with 5
  to 15 objects each; ADE20K-layout scenes for mmseg configs, :func:`mmpola.datasets.make_demo_ade`),
  or the real data under ``--data-root``. The pipeline is the config's own (``--img-scale`` changes
  its resize scales and crop sizes);
* no pretrained weights (``init_cfg=None`` on the backbone, no ``load_from``), no validation, no
  checkpoint hook; the other hooks as ``--hooks`` says (:func:`apply_hooks`);
* the run stops after ``--warmup`` + ``--iters`` (+ 1 profiled) iterations; right after the timed ones, the
  batches of the last few of them that came at a size new to the run are run once more (:data:`AGAIN`), and with
  ``--profile`` the profiled iteration's batch too, profiled again, where its size was new: what the same work
  costs once its size has been seen.

``--also-with VARIABLE=VALUE`` times each config once more, right after its own row and in the same process,
with one of mmpola's implementation variables set for that row (read by the models at each call): a ratio of two
implementations measured side by side, where separate commands would be minutes apart.

Two hooks of their own time the iterations: one with the highest priority at ``before_train_iter``,
one with the lowest at ``after_train_iter``, each synchronising the device first. An iteration's time
runs from the end of the previous one to its own end: loading its batch, every hook, the forward and
backward passes, the optimizer step; its data time from the end of the previous iteration to its
first hook. The peak memory of the timed iterations is read in each of them by both hooks (mmengine's logger
resets the CUDA peak where it logs, between the two). The first hook also notes the batch's input size and
whether an earlier iteration had it (:func:`sizes_summary`).
"""
import collections
import contextlib
import copy
import gc
import importlib.util
import json
import os
import os.path as osp
import re
import resource
import shutil
import sys
import tempfile
import time
import uuid
from unittest import mock

import torch
from benchmark_host import SYNC_OPS as HOST_READ_OPS

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
MMPOLA_RUNTIME = osp.join(ROOT, 'configs', '_base_', 'runtime.py')

HOOK_MODES = ('mmpola', 'library', 'config')
HOOK_MODE_TEXT = {
    'mmpola': "every config runs its task library's default hooks (checkpoint hook removed) plus mmpola's runtime "
              'hooks of configs/_base_/runtime.py ({hooks}), added where a config lacks them',
    'library': "every config runs its task library's default hooks (checkpoint hook removed) and none of mmpola's "
               'runtime hooks ({hooks} are removed where a config has them)',
    'config': "each config runs its own default hooks (checkpoint hook removed) and custom hooks: mmpola's configs "
              "have mmpola's runtime hooks ({hooks}), mmdet's and mmseg's do not",
}

# COCO-like image sizes (height, width): the pipeline resizes them to the config's scale, as COCO's
COCO_SHAPES = ((480, 640), (427, 640), (640, 480), (640, 427))
ADE_HEIGHT = 512  # ADE20K-like: the short side about 512, widths 1 to 1.5 times that
DISTINCT_IMAGES = 8  # generated images; the dataset lists them again until it holds every batch
OBJECTS_PER_IMAGE = (5, 15)
# what makes the host wait for the device, by the profiler's names: the operators that read a value on the host
# (those that benchmark.py's ops and host count) and CUDA's synchronisations
SYNC_OPS = tuple(f'aten::{name}' for name in HOST_READ_OPS) + ('cudaStreamSynchronize', 'cudaDeviceSynchronize',
                                                              'cudaEventSynchronize')
TOP_OPS = 15
# timed iterations at a size new to the run whose batch runs once more after the timed ones (the last ones)
AGAIN = 3
HOST_OWN_CODE = ' (own code)'  # a part's range in the host table: its time outside the ops and calls it made
MEMORY_TEXT = {
    'cuda': 'torch.cuda.max_memory_allocated() over the timed iterations (weights, gradients, optimizer state, '
            'activations)',
    'cpu': "peak resident set size of the benchmark process over the timed iterations (VmHWM, reset after the "
           "warm-up; dataloader workers not included)",
}


class TrainBenchError(Exception):
    """A config that cannot be benchmarked as asked; the message names the cause and the fix."""


# --------------------------------------------------------------------------------------------------
# the config
# --------------------------------------------------------------------------------------------------


def resolve_config(spec):
    """The file of ``spec``: a path, or ``package::relative/path.py`` of an installed OpenMMLab package
    (mmdet, mmseg: their configs ship inside the package, under ``.mim/configs``)."""
    if '::' not in spec:
        return spec
    package, _, relative = spec.partition('::')
    try:
        found = importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # e.g. a dotted name whose parent is missing
        found = False
    if not found:
        raise TrainBenchError(f'the package {package!r} is not installed here, so its configs are not '
                              'either (install it, see requirements/pins.txt, or leave this config out)')
    from mmengine.utils import get_installed_path
    path = osp.join(get_installed_path(package), '.mim', 'configs', relative)
    if not osp.isfile(path):
        raise TrainBenchError(f'{package} has no config {relative!r} (looked for {path})')
    return path


def config_label(spec):
    """Short name of a config for the table: its file stem, prefixed by the package for ``pkg::`` configs."""
    stem = osp.splitext(osp.basename(spec.partition('::')[2] or spec))[0]
    return f"{spec.partition('::')[0]}::{stem}" if '::' in spec else stem


def file_stem(spec):
    """``config_label`` in letters, digits and ``._-`` only (for file names)."""
    return re.sub(r'[^A-Za-z0-9._-]+', '_', config_label(spec).replace('::', '_'))


def _hook_type_name(entry):
    from mmpola.runtime.config_check import _hook_name
    return _hook_name(entry)


def mmpola_runtime_hooks():
    """mmpola's runtime settings (configs/_base_/runtime.py): ``(custom_hooks, other top-level settings)``."""
    from mmengine.config import Config
    runtime = Config.fromfile(MMPOLA_RUNTIME).to_dict()
    hooks = runtime.pop('custom_hooks')
    return hooks, runtime


def apply_hooks(cfg, mode):
    """Make the hooks of ``cfg`` those of ``mode`` (see HOOK_MODE_TEXT); the checkpoint hook goes in
    every mode (the benchmark saves nothing). Returns the custom hooks' type names."""
    if mode not in HOOK_MODES:
        raise ValueError(f'hooks mode {mode!r} is not one of {HOOK_MODES}')
    if cfg.get('default_hooks') is not None:
        cfg.default_hooks['checkpoint'] = None  # mmengine: a default hook set to None is not registered
    ours, settings = mmpola_runtime_hooks()
    our_names = {_hook_type_name(h) for h in ours}
    hooks = list(cfg.get('custom_hooks') or [])
    if mode == 'library':
        hooks = [h for h in hooks if _hook_type_name(h) not in our_names]
    elif mode == 'mmpola':
        present = {_hook_type_name(h) for h in hooks}
        hooks += [copy.deepcopy(h) for h in ours if _hook_type_name(h) not in present]
        for key, value in settings.items():  # the hooks' settings (nonfinite_loss, ...), where missing
            if key not in cfg:
                cfg[key] = copy.deepcopy(value)
    cfg.custom_hooks = hooks
    return [_hook_type_name(h) for h in hooks]


def _unwrap_repeat(loader):
    """The training dataset config (RepeatDataset wrappers dropped: they only lengthen an epoch) and its
    innermost dataset (where the files and the pipeline are named)."""
    dataset = loader.dataset
    while dataset.get('type') in ('RepeatDataset', 'mmengine.RepeatDataset') and 'dataset' in dataset:
        dataset = dataset.dataset
    loader.dataset = dataset
    inner = dataset
    while 'dataset' in inner:
        inner = inner.dataset
    return inner


def _dataset_class(dataset_cfg, scope):
    from mmengine.registry import DATASETS
    name = dataset_cfg.get('type')
    if not isinstance(name, str):
        return name
    with DATASETS.switch_scope_and_registry(scope) as registry:
        cls = registry.get(name)
    if cls is None:
        raise TrainBenchError(f'train_dataloader.dataset.type={name!r} is registered nowhere in scope {scope!r}')
    return cls


def override_scale(node, width, height):
    """``--img-scale W H``: every resize scale of a pipeline becomes (W, H) (each of the choices of a
    multi-scale resize), every absolute crop size at most (H, W). In place; returns the count changed."""
    from mmpola.runtime.config import config_dicts
    changed = 0
    for entry in config_dicts(node):
        kind = str(entry.get('type', ''))
        if 'Resize' in kind and entry.get('scale') is not None:
            entry['scale'] = (width, height)
            changed += 1
        if 'Resize' in kind and entry.get('scales') is not None:
            entry['scales'] = [(width, height)]
            changed += 1
        if 'Crop' in kind and entry.get('crop_size') is not None and \
                entry.get('crop_type', 'absolute') in ('absolute', 'absolute_range'):
            crop_h, crop_w = entry['crop_size']
            entry['crop_size'] = (min(crop_h, height), min(crop_w, width))
            changed += 1
    return changed


def needed_iterations(args):
    return args.warmup + args.iters + (1 if args.profile else 0)


def builds_mmpola_backbone(backbone_cfg):
    """Whether a backbone config builds one of mmpola's backbones (they take ``attn_impl``)."""
    import inspect

    from mmengine.registry import MODELS
    cls = MODELS.get(str(backbone_cfg.get('type', '')))
    return cls is not None and 'attn_impl' in inspect.signature(cls.__init__).parameters


def cfg_options(values):
    """``--cfg-options KEY=VALUE ...`` as tools/train.py reads them (mmengine's DictAction), or None."""
    if not values:
        return None
    import argparse

    from mmengine.config import DictAction
    namespace = argparse.Namespace()
    DictAction(option_strings=['--cfg-options'], dest='cfg_options')(None, namespace, values)
    return namespace.cfg_options


def prepare_config(spec, args, work_dir):
    """Load ``spec`` and make it the benchmark's run (see the module doc); returns ``(cfg, scope, notes)``.

    The steps are tools/train.py's (mmpola.runtime: load_config, register_task_modules, setup_amp,
    adapt_cfg_to_machine, check_config); the data is generated under ``work_dir`` unless
    ``args.data_root`` names real data."""
    from mmpola.runtime import config as config_tools
    from mmpola.runtime import launch
    from mmpola.runtime.config_check import check_config

    options = cfg_options(getattr(args, 'cfg_options', None))
    cfg = config_tools.load_config(resolve_config(spec), options)
    scope = config_tools.register_task_modules(cfg)
    if scope not in ('mmdet', 'mmseg'):
        raise TrainBenchError(f"default_scope {scope!r}: the train and memory benchmarks take detection (mmdet) and "
                              'segmentation (mmseg) configs')
    cfg.work_dir = work_dir
    # the Runner's logger, visualizer and scope are process-wide instances named by these: one set per run
    cfg.experiment_name = f'trainbench_{file_stem(spec)}_{uuid.uuid4().hex[:8]}'
    if cfg.get('visualizer') is not None:
        cfg.visualizer.name = cfg.experiment_name
    cfg.log_level = 'WARNING'  # the table is the output; the Runner's config dump and progress lines are not
    cfg.load_from = None
    cfg.resume = False
    cfg.randomness = dict(cfg.get('randomness') or {}, seed=args.seed)
    for key in ('val_dataloader', 'val_cfg', 'val_evaluator', 'test_dataloader', 'test_cfg', 'test_evaluator'):
        cfg[key] = None

    model = cfg.model
    if model.get('backbone') is not None:  # random weights: no download, no local checkpoint
        model.backbone.init_cfg = None
        if 'pretrained' in model.backbone:
            model.backbone.pretrained = None
    if 'pretrained' in model:
        model.pretrained = None

    hooks = apply_hooks(cfg, args.hooks)
    attn_impl = getattr(args, 'attn_impl', None)
    if attn_impl and model.get('backbone') is not None and builds_mmpola_backbone(model.backbone):
        model.backbone.attn_impl = attn_impl

    loader = cfg.train_dataloader
    if args.batch_size:
        loader.batch_size = args.batch_size
    if args.img_scale:
        width, height = args.img_scale
        if not override_scale(loader.dataset, width, height):
            raise TrainBenchError('--img-scale found no resize in the training pipeline')
        preprocessor = model.get('data_preprocessor')
        if preprocessor is not None and preprocessor.get('size') is not None:  # mmseg pads to the crop size
            preprocessor.size = (min(preprocessor.size[0], height), min(preprocessor.size[1], width))
    needed = loader.batch_size * needed_iterations(args)
    dataset = _unwrap_repeat(loader)
    if args.data_root:
        config_tools.move_data_root(cfg, args.data_root)
        dataset = _unwrap_repeat(cfg.train_dataloader)
        dataset.indices = needed  # the first images: an epoch holds exactly the iterations run
        data = f'{args.data_root} (first {needed} training images)'
    else:
        data = generate_data(dataset, scope, needed, osp.join(work_dir, 'data'), args.seed)

    notes = [f"--cfg-options {' '.join(args.cfg_options)}"] if options else []
    if attn_impl and model.get('backbone') is not None and builds_mmpola_backbone(model.backbone):
        notes.append(f'attention implementation of the backbone: {attn_impl}')
    if args.amp:
        notes.append(launch.setup_amp(cfg, None))
    notes += launch.adapt_cfg_to_machine(cfg, 'none')
    check_config(cfg)
    return cfg, scope, dict(notes=notes, hooks=hooks, data=data)


def generate_data(dataset, scope, count, root, seed):
    """Write a dataset of ``count`` images in the layout of ``dataset`` (a config, changed to read it)."""
    cls = _dataset_class(dataset, scope)
    distinct = min(count, DISTINCT_IMAGES)
    if scope == 'mmdet':
        from mmdet.datasets import CocoDataset
        if not issubclass(cls, CocoDataset):
            raise TrainBenchError(f'the training dataset is a {cls.__name__}, not a COCO-format one: the generated '
                                  'data is COCO-format; give the real data with --data-root')
        classes = (dataset.get('metainfo') or {}).get('classes') or cls.METAINFO['classes']
        from mmpola.datasets import demo_coco_files, make_demo_coco
        make_demo_coco(root, num_train=distinct, num_val=0, seed=seed, min_objects=OBJECTS_PER_IMAGE[0],
                       max_objects=OBJECTS_PER_IMAGE[1], image_shapes=COCO_SHAPES, classes=tuple(classes),
                       overwrite=True, verbose=False)
        ann_file = demo_coco_files(root)['train']
        per_image = _repeat_coco_images(ann_file, count)
        dataset.update(data_root=root, ann_file=osp.relpath(ann_file, root), data_prefix=dict(img='train/'))
        return (f'generated COCO-format, {len(classes)} classes, {distinct} distinct images of '
                f'{"/".join(f"{w}x{h}" for h, w in COCO_SHAPES)}, {min(per_image)}-{max(per_image)} objects each')
    from mmseg.datasets import ADE20KDataset
    if not issubclass(cls, ADE20KDataset):
        raise TrainBenchError(f'the training dataset is a {cls.__name__}, not ADE20K: the generated data has '
                              "ADE20K's layout; give the real data with --data-root")
    from mmpola.datasets import make_demo_ade
    make_demo_ade(root, num_train=distinct, num_val=0, size=ADE_HEIGHT, seed=seed)
    _repeat_ade_images(root, distinct, count)
    dataset.update(data_root=root, data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'))
    return f'generated ADE20K-layout scenes, {distinct} distinct images of height {ADE_HEIGHT}'


def _repeat_coco_images(ann_file, count):
    """List the file's images again (new ids, same files, their annotations copied) until it holds
    ``count``; returns the number of objects of each distinct image."""
    with open(ann_file) as f:
        data = json.load(f)
    images = data['images']
    by_image = {}
    for ann in data['annotations']:
        by_image.setdefault(ann['image_id'], []).append(ann)
    out_images, out_anns = [], []
    for index in range(count):
        image = dict(images[index % len(images)])
        source = image['id']
        image['id'] = index + 1
        out_images.append(image)
        for ann in by_image.get(source, []):
            out_anns.append(dict(ann, id=len(out_anns) + 1, image_id=image['id']))
    data.update(images=out_images, annotations=out_anns)
    with open(ann_file, 'w') as f:
        json.dump(data, f)
    return [sum(1 for a in by_image.get(image['id'], []) if not a['iscrowd']) for image in images]


def _repeat_ade_images(root, distinct, count):
    """Links demo_ade_<i> -> demo_ade_<i mod distinct> until the training split holds ``count`` images."""
    for sub, ext in (('images', '.jpg'), ('annotations', '.png')):
        folder = osp.join(root, sub, 'training')
        for index in range(distinct, count):
            target = osp.join(folder, f'demo_ade_{index % distinct:05d}{ext}')
            link = osp.join(folder, f'demo_ade_{index:05d}{ext}')
            try:
                os.link(target, link)
            except OSError:
                shutil.copyfile(target, link)


def amp_label(cfg):
    wrapper = cfg.get('optim_wrapper') or {}
    kind = str(wrapper.get('type', 'OptimWrapper'))
    if 'BF16' in kind:
        return 'bf16 (backbone)'
    if 'Amp' in kind:
        return str(wrapper.get('dtype') or 'float16').replace('float', 'fp').replace('bfp', 'bf')
    return 'off'


# --------------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------------


def _synchronize(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def _reset_peak(device):
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')  # the kernel's high-water mark of the RSS restarts from the current RSS
        return True
    except OSError:
        return False


# the CUDA caching allocator's events (torch.cuda.memory_stats) counted over the timed iterations: memory asked of
# the driver (cudaMalloc), given back (cudaFree: the cache emptied after a failed request), the failed requests
# (retries) and the synchronisations of every stream they cost; each makes the host wait for the device
ALLOCATOR_EVENTS = {'num_device_alloc': 'cudaMalloc', 'num_device_free': 'cudaFree',
                    'num_alloc_retries': 'retries', 'num_sync_all_streams': 'syncs of all streams'}


def _allocator_events(device):
    """{event: count so far} of the CUDA caching allocator (:data:`ALLOCATOR_EVENTS`); None off CUDA."""
    if device.type != 'cuda':
        return None
    stats = torch.cuda.memory_stats(device)
    return {key: int(stats.get(key, 0)) for key in ALLOCATOR_EVENTS}


def allocator_text(events):
    """'12 cudaMalloc, 0 cudaFree, 0 retries, 0 syncs of all streams'."""
    return ', '.join(f'{events[key]} {label}' for key, label in ALLOCATOR_EVENTS.items())


def error_line(error, limit=200):
    """``'RuntimeError: <the first line of its message, at most limit characters>'``: an error as one line of a
    benchmark's output, where the rows it did not stop still come."""
    first = (str(error).strip().splitlines() or [''])[0][:limit]
    return f'{type(error).__name__}: {first}'


def allocator_settings():
    """The CUDA caching allocator's settings of this process as the environment gave them when CUDA started
    ('PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True', or 'its defaults')."""
    conf = os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '').strip()
    return f'PYTORCH_CUDA_ALLOC_CONF={conf}' if conf else 'its defaults'


def _peak_mib(device):
    if device.type == 'cuda':
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('VmHWM:'):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB (lifetime peak)


def batch_input_size(model, data_batch):
    """(height, width) of the batch the model's data preprocessor makes of ``data_batch``'s images (each padded to
    the largest, rounded up to the preprocessor's divisor, at least its fixed ``size``), or None where the batch
    holds no images. Kernels, execution plans and compiled graphs chosen per input shape see this size."""
    inputs = data_batch.get('inputs') if isinstance(data_batch, dict) else None
    if torch.is_tensor(inputs):
        inputs = list(inputs)
    if not inputs or not all(torch.is_tensor(t) and t.dim() >= 2 for t in inputs):
        return None
    height, width = (max(t.shape[axis] for t in inputs) for axis in (-2, -1))
    preprocessor = getattr(model, 'data_preprocessor', None)
    fixed = getattr(preprocessor, 'size', None)  # mmseg: pad to the crop size
    if fixed:
        height, width = max(height, fixed[0]), max(width, fixed[1])
    divisor = getattr(preprocessor, 'pad_size_divisor', None) or getattr(preprocessor, 'size_divisor', None) or 1
    return -(-height // divisor) * divisor, -(-width // divisor) * divisor


class IterationClock:
    """State shared by the two timing hooks (:func:`timing_hooks`)."""

    def __init__(self, device, warmup, iters, profiler=None):
        self.device, self.warmup, self.iters, self.profiler = device, warmup, iters, profiler
        self.index = 0  # iterations begun
        self.last_end = None
        self.iter_times, self.data_times = [], []
        # the batch input size of each timed iteration, and whether no earlier iteration (warm-up included) had it
        self.iter_sizes, self.iter_new = [], []
        self.sizes_seen = set()
        self.size = self.size_is_new = None  # those of the iteration begun last (the profiled one, after the run)
        self.peak_mib = None
        self.peak_reset = True
        self.allocator = None  # the allocator's events over the timed iterations (CUDA)
        self._allocator_start = None
        self.profiled_seconds = None
        self._profile_start = None
        # the last AGAIN timed iterations at a new size: (batch, size, seconds without the batch's loading)
        self._new_size_batches = collections.deque(maxlen=AGAIN)
        self.again = []  # dicts: size, first (s, without loading), again (s): each of them run once more
        self.profiler_again = None  # the profiled iteration's batch run once more, where its size was new
        self.profiled_again_seconds = None
        self.again_error = None  # why a batch could not run again

    @property
    def timed(self):
        return self.warmup <= self.index < self.warmup + self.iters

    def begin(self, runner, data_batch=None):
        _synchronize(self.device)
        now = time.perf_counter()
        if self.timed:
            self.data_times.append(now - self.last_end)
        self.size = batch_input_size(_unwrap_model(runner.model), data_batch) if data_batch is not None else None
        self.size_is_new = self.size is not None and self.size not in self.sizes_seen
        self.sizes_seen.add(self.size)
        if self.profiler is not None and self.index == self.warmup + self.iters:
            self.profiler.start(iteration_parts(runner))
            self._profile_start = time.perf_counter()

    def observe_peak(self):
        """Keep the largest peak memory read in a timed iteration. Read at the first of the iteration's
        ``after_train_iter`` hooks too, before mmengine's logger reads the CUDA peak and resets it (each
        logging iteration), and again at the last (what the hooks after the logger allocate)."""
        if self.timed:
            peak = _peak_mib(self.device)
            self.peak_mib = peak if self.peak_mib is None else max(self.peak_mib, peak)

    def end(self, runner, data_batch=None):
        _synchronize(self.device)
        now = time.perf_counter()
        if self.timed:
            self.iter_times.append(now - self.last_end)
            self.iter_sizes.append(self.size)
            self.iter_new.append(self.size_is_new)
            self.observe_peak()
            if self.size_is_new and data_batch is not None:
                self._new_size_batches.append((data_batch, self.size, self.iter_times[-1] - self.data_times[-1]))
            if self.index == self.warmup + self.iters - 1:
                events = _allocator_events(self.device)
                if events is not None and self._allocator_start is not None:
                    self.allocator = {key: events[key] - self._allocator_start[key] for key in events}
                with self._again_errors_noted():  # after the timed iterations' counts
                    for batch, size, first in self._new_size_batches:
                        self.again.append(dict(size=size, first=first, again=self._run_again(runner, batch)))
                self._new_size_batches.clear()
                if self.profiler is None:
                    runner.train_loop.stop_training = True
        elif self.index == self.warmup + self.iters:  # the profiled iteration
            self.profiled_seconds = now - self._profile_start
            self.profiler.stop()
            if self.size_is_new and data_batch is not None:
                with self._again_errors_noted():
                    profiler = IterationProfiler(self.device)
                    profiler.start(iteration_parts(runner))
                    try:
                        self.profiled_again_seconds = self._run_again(runner, data_batch)
                    finally:
                        profiler.stop()
                    self.profiler_again = profiler
            runner.train_loop.stop_training = True
        if self.index == self.warmup - 1:
            self.peak_reset = _reset_peak(self.device)
            self._allocator_start = _allocator_events(self.device)
        self.last_end = time.perf_counter()
        self.index += 1

    @contextlib.contextmanager
    def _again_errors_noted(self):
        """A context in which an error of running a batch again (out of memory, a profiler that does not start
        twice) is noted in :attr:`again_error` rather than raised: the row's timed iterations stand without it."""
        try:
            yield
        except Exception as error:  # whatever it is, the timed row must not be lost to it
            self.again_error = error_line(error)

    def _run_again(self, runner, data_batch):
        """Seconds of one more training step of ``data_batch`` (the loop's step without its hooks and loading:
        the model's ``train_step`` with the runner's optimizer wrapper), the device synchronised around it."""
        _synchronize(self.device)
        start = time.perf_counter()
        runner.model.train_step(data_batch, optim_wrapper=runner.optim_wrapper)
        _synchronize(self.device)
        return time.perf_counter() - start


def timing_hooks(clock):
    """Two hooks around each iteration: the first of its ``before_train_iter`` and the last of its
    ``after_train_iter`` hooks (the first hook's ``after_train_iter`` reads the peak memory:
    :meth:`IterationClock.observe_peak`)."""
    from mmengine.hooks import Hook

    class IterationStart(Hook):
        priority = 'HIGHEST'

        def before_train_iter(self, runner, batch_idx, data_batch=None):
            clock.begin(runner, data_batch)

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            clock.observe_peak()

    class IterationEnd(Hook):
        priority = 'LOWEST'

        def before_train(self, runner):
            clock.last_end = time.perf_counter()

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            clock.end(runner, data_batch)

    return IterationStart(), IterationEnd()


# --------------------------------------------------------------------------------------------------
# profiling one iteration
# --------------------------------------------------------------------------------------------------


def _unwrap_model(model):
    from mmengine.model import is_model_wrapper
    return model.module if is_model_wrapper(model) else model


def iteration_parts(runner):
    """``[(label, object, method names)]``: the parts of a training iteration timed as ranges in the
    profile: the data preprocessor, the backbone, the neck and each head (forward and, for the heads,
    their loss with target assignment), the loss parsing, and the optimizer wrapper's backward, step
    and zero_grad."""
    model = _unwrap_model(runner.model)
    parts = [('model.data_preprocessor', getattr(model, 'data_preprocessor', None), ('forward',))]
    for name in ('backbone', 'neck'):
        parts.append((f'model.{name}', getattr(model, name, None), ('forward',)))
    for name, child in model.named_children():
        if name.endswith('_head'):
            parts.append((f'model.{name}', child, ('forward', 'loss', 'loss_and_predict', 'predict')))
    parts.append(('model.parse_losses', model, ('parse_losses',)))
    for method in ('backward', 'step', 'zero_grad'):
        parts.append((f'optim_wrapper.{method}', runner.optim_wrapper, (method,)))
    return [(label, obj, methods) for label, obj, methods in parts if obj is not None]


_MISSING = object()


class IterationProfiler:
    """torch.profiler around one iteration, with a ``record_function`` range per part (:func:`iteration_parts`, or
    the ranges the profiled code records itself)."""

    def __init__(self, device):
        self.device = device
        self.prof = None
        self.labels = []
        self._patched = []

    def _wrap(self, obj, method, label, active):
        original = getattr(obj, method)  # bound method, or an instance attribute (mmengine's schedulers wrap step)
        previous = obj.__dict__.get(method, _MISSING)

        def wrapped(*args, **kwargs):
            if active:  # e.g. a head's loss() calling its forward(): one range
                return original(*args, **kwargs)
            active.append(True)
            try:
                with torch.profiler.record_function(label):
                    return original(*args, **kwargs)
            finally:
                active.pop()

        obj.__dict__[method] = wrapped  # an instance attribute: this object's calls only
        self._patched.append((obj, method, previous))

    def start(self, parts, ranges=()):
        """Start profiling, with a range per part of ``parts`` (``[(label, object, method names)]``, e.g.
        :func:`iteration_parts`) and ``ranges``, the labels of the ranges the profiled code records itself."""
        self.labels.extend(ranges)
        for label, obj, methods in parts:
            active = []  # shared by the part's methods
            found = [m for m in methods if callable(getattr(obj, m, None))]
            for method in found:
                self._wrap(obj, method, label, active)
            if found:
                self.labels.append(label)
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == 'cuda':
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=activities, record_shapes=False, with_stack=False)
        self.prof.start()

    def stop(self):
        self.prof.stop()
        for obj, method, previous in reversed(self._patched):
            if previous is _MISSING:
                del obj.__dict__[method]
            else:
                obj.__dict__[method] = previous
        self._patched = []


def _top_by_time(named_times):
    """(name, count, total us) of the ``TOP_OPS`` names with the most time, from (name, us) pairs."""
    totals = {}  # name: [count, us]
    for name, us in named_times:
        entry = totals.setdefault(name, [0, 0.0])
        entry[0] += 1
        entry[1] += us
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])[:TOP_OPS]
    return [(name, count, us) for name, (count, us) in ranked]


def summarize_profile(profiler, wall_seconds, device):
    """The numbers of the profile summary (a dict; times in ms)."""
    from torch.autograd import DeviceType
    events = list(profiler.prof.events())
    cpu_events = [e for e in events if e.device_type == DeviceType.CPU]
    # record_function ranges also appear on the device's timeline (gpu_user_annotation): not kernels (the
    # events of torch 2.11 have no activity type: there such a range is known by its name alone)
    annotations = {e.name for e in cpu_events if e.is_user_annotation}
    device_events = [e for e in events if e.device_type != DeviceType.CPU and not e.is_user_annotation
                     and e.name not in annotations
                     and 'user_annotation' not in str(getattr(e, 'activity_type', None) or '')]
    labels = set(profiler.labels)
    summary = dict(device=device.type, wall_ms=1e3 * wall_seconds)

    syncs = {name: sum(1 for e in cpu_events if e.name == name) for name in SYNC_OPS}
    syncs['Memcpy DtoH'] = sum(1 for e in device_events if 'DtoH' in e.name)
    summary['syncs'] = syncs

    if device.type == 'cuda':
        summary['device_ms'] = sum(e.time_range.elapsed_us() for e in device_events) / 1e3
        summary['kernels'] = sum(1 for e in device_events if not e.name.startswith(('Memcpy', 'Memset')))
        total_us = 1e3 * summary['device_ms']
        # the kernels under their own names (Triton's included), and the ops that launched them
        summary['top_kernels'] = [dict(name=name, calls=calls, ms=us / 1e3, percent=100 * us / max(total_us, 1e-9))
                                  for name, calls, us in _top_by_time((e.name, e.time_range.elapsed_us())
                                                                      for e in device_events)]
        op_times = ((e.name, e.self_device_time_total) for e in cpu_events
                    if e.name not in labels and not e.is_async and e.self_device_time_total > 0)
        # the host's side: what the CPU spent in each op, CUDA runtime call (launches, cudaMalloc, syncs) and
        # part's own code (a part's range's self time: Python, Triton's launches and compilations, hooks)
        host = [(e.name + (HOST_OWN_CODE if e.name in labels else ''), e.self_cpu_time_total) for e in cpu_events
                if not e.is_async]
        summary['top_host'] = [dict(name=name, calls=calls, self_ms=us / 1e3,
                                    percent=100 * us / max(1e3 * summary['wall_ms'], 1e-9))
                               for name, calls, us in _top_by_time(host)]
    else:
        aten = [e for e in cpu_events if e.name.startswith('aten::')]
        summary['aten_ops'] = len(aten)
        summary['self_cpu_ms'] = sum(e.self_cpu_time_total for e in cpu_events if not e.is_async) / 1e3
        total_us = 1e3 * summary['self_cpu_ms']
        op_times = ((e.name, e.self_cpu_time_total) for e in cpu_events if e.name not in labels and not e.is_async)
    summary['top_ops'] = [dict(name=name, calls=calls, self_ms=us / 1e3, percent=100 * us / max(total_us, 1e-9))
                          for name, calls, us in _top_by_time(op_times)]

    # the parts: CPU time = the range's wall time; device time = kernels launched inside it, on its thread
    # and (backward on CUDA runs on autograd's own thread) by top-level ops of other threads that start in it
    ranges = [e for e in cpu_events if e.name in labels and not e.is_async]
    main_threads = {e.thread for e in ranges}
    parts = {label: dict(calls=0, cpu_ms=0.0, device_ms=0.0) for label in profiler.labels}
    for e in ranges:
        parts[e.name]['calls'] += 1
        parts[e.name]['cpu_ms'] += e.cpu_time_total / 1e3
        parts[e.name]['device_ms'] += e.device_time_total / 1e3
    if device.type == 'cuda':
        for e in cpu_events:
            if e.thread in main_threads or e.cpu_parent is not None or e.is_async or not e.device_time_total:
                continue
            start = e.time_range.start
            for r in ranges:
                if r.time_range.start <= start <= r.time_range.end:
                    parts[r.name]['device_ms'] += e.device_time_total / 1e3
                    break
    summary['parts'] = parts
    return summary


def _name_cell(name):
    """An op's or kernel's name as a table cell: at most 90 characters, no column separator."""
    return (name if len(name) <= 90 else name[:87] + '...').replace('|', '/')


ITERATION_PARTS_NOTE = ("A head's range holds its forward and its loss (target assignment included); backward and the "
                        "optimizer step are the optimizer wrapper's.")


def render_profile(summary, title, what='training iteration', parts_note=ITERATION_PARTS_NOTE,
                   rest='rest (hooks, loop, untracked)', loaded=' (with the profiler\'s overhead; its batch was '
                   'loaded before the profile started)'):
    """The Markdown summary of a profile (:func:`summarize_profile`) of one ``what``, with ``parts_note`` under its
    table of parts, whose last row, ``rest``, has what no part holds; ``loaded`` follows the wall time."""
    cuda = summary['device'] == 'cuda'
    lines = [f'## Profile of one {what}: {title}', '']
    lines.append(f"- wall time of the profiled {what}: {summary['wall_ms']:.1f} ms{loaded}")
    if cuda:
        lines.append(f"- total device time (kernels, memcpy, memset): {summary['device_ms']:.1f} ms")
        lines.append(f"- kernels launched: {summary['kernels']}")
    else:
        lines.append(f"- total self CPU time of the ops: {summary['self_cpu_ms']:.1f} ms")
        lines.append(f"- aten ops (at every nesting level): {summary['aten_ops']}")
    syncs = summary['syncs']
    lines.append('- host-device syncs: ' + ', '.join(f'{name} {count}' for name, count in syncs.items())
                 + (' (one cudaDeviceSynchronize is the benchmark\'s own, closing the iteration; aten::item '
                    'calls aten::_local_scalar_dense)' if cuda else
                    ' (on the CPU nothing waits for a device: these are the calls that would sync on CUDA)'))
    what = 'self device time' if cuda else 'self CPU time'
    lines += ['', f'### Top {TOP_OPS} ops by {what}', '', f'| op | calls | {what} ms | % of total |',
              '|---|---:|---:|---:|']
    for op in summary['top_ops']:
        lines.append(f"| {_name_cell(op['name'])} | {op['calls']} | {op['self_ms']:.2f} | {op['percent']:.1f} |")
    if cuda:
        lines += ['', f'### Top {TOP_OPS} kernels by device time', '', '| kernel | launches | device ms | % of total |',
                  '|---|---:|---:|---:|']
        for k in summary['top_kernels']:
            lines.append(f"| {_name_cell(k['name'])} | {k['calls']} | {k['ms']:.2f} | {k['percent']:.1f} |")
        lines += ['', f'### Top {TOP_OPS} by host time', '',
                  "The CPU's self time of each op, CUDA runtime call and part's own code "
                  f"({HOST_OWN_CODE.strip()}: its Python, Triton's launches and compilations, its hooks; the "
                  "backward's also its wait for autograd's thread, whose ops are rows of their own): where the "
                  "host's share of a slow iteration goes.", '',
                  '| op, call or part | calls | self host ms | % of wall time |', '|---|---:|---:|---:|']
        for op in summary['top_host']:
            lines.append(f"| {_name_cell(op['name'])} | {op['calls']} | {op['self_ms']:.2f} | {op['percent']:.1f} |")
    lines += ['', f'### Time per part of the {what}', '',
              '| part | calls | CPU ms (wall of the range) |' + (' device ms |' if cuda else '') + ' % of iteration |',
              '|---|---:|---:|' + ('---:|' if cuda else '') + '---:|']
    total = summary['device_ms'] if cuda else summary['wall_ms']
    accounted = 0.0
    for label, part in summary['parts'].items():
        value = part['device_ms'] if cuda else part['cpu_ms']
        accounted += value
        lines.append(f"| {label} | {part['calls']} | {part['cpu_ms']:.1f} |" +
                     (f" {part['device_ms']:.1f} |" if cuda else '') + f' {100 * value / max(total, 1e-9):.1f} |')
    left = max(total - accounted, 0.0)
    lines.append(f'| {rest} | | ' + ('|' if cuda else f'{left:.1f} |') + (f' {left:.1f} |' if cuda else '') +
                 f' {100 * left / max(total, 1e-9):.1f} |')
    lines += ['', ('% of iteration: of the total device time. ' if cuda else '% of iteration: of the wall time. ') +
              parts_note]
    return '\n'.join(lines) + '\n'


def write_iterations(clock, spec, out_dir):
    """``{stem}_iterations.json``: each timed iteration's s/iter, data s/iter, batch input size and whether the
    size was new to the run, and the batches run again (:attr:`IterationClock.again`; beside the profile)."""
    os.makedirs(out_dir, exist_ok=True)

    def size_list(size):
        return list(size) if size is not None else None

    rows = [dict(seconds=t, data_seconds=d, size=size_list(size), new=bool(new))
            for t, d, size, new in zip(clock.iter_times, clock.data_times, clock.iter_sizes, clock.iter_new)]
    again = [dict(size=size_list(a['size']), first_seconds=a['first'], again_seconds=a['again']) for a in clock.again]
    with open(osp.join(out_dir, f'{file_stem(spec)}_iterations.json'), 'w') as f:
        json.dump(dict(config=spec, warmup=clock.warmup, iterations=rows, again=again), f, indent=1)


def write_profile(profiler, wall_seconds, device, spec, out_dir, title, stem_suffix='', **render):
    """Write the chrome trace and the summary (Markdown and JSON) of a profiled iteration (``wall_seconds``
    long; files named after the config, with ``stem_suffix``); returns the summary's Markdown (a line saying why
    there is none where torch's profiler events lack what the summary reads: the timed rows and the trace
    stay). ``render``: :func:`render_profile`'s wording for what was profiled."""
    os.makedirs(out_dir, exist_ok=True)
    stem = file_stem(spec) + stem_suffix
    trace = osp.join(out_dir, f'{stem}_trace.json')
    profiler.prof.export_chrome_trace(trace)
    try:
        summary = summarize_profile(profiler, wall_seconds, device)
    except (AttributeError, KeyError, TypeError) as err:  # events of a torch version the summary does not know
        return f'{title}: no profile summary ({error_line(err)}); the chrome trace: {trace}'
    text = render_profile(summary, title, **render)
    with open(osp.join(out_dir, f'{stem}_profile.md'), 'w') as f:
        f.write(text)
    with open(osp.join(out_dir, f'{stem}_profile.json'), 'w') as f:
        json.dump(dict(summary, config=spec, title=title), f, indent=1)
    return text


# --------------------------------------------------------------------------------------------------
# one config, all configs
# --------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def triton_compilations(counting):
    """Yield a list that gets the name of each Triton kernel compiled inside (or loaded from Triton's disk
    cache: a kernel, config and specialisation new to the process) while ``counting()`` is true, through
    Triton's public ``jit_post_compile_hook`` (a hook already set still runs, and is set again after); a list
    that stays empty where Triton, or that hook, is missing. Training iterations that compile kernels pay
    for it in their time: at changing detection image sizes, a kernel specialised on a size would."""
    compiled = []
    try:
        from triton import knobs
        runtime = knobs.runtime
        previous = runtime.jit_post_compile_hook
    except (ImportError, AttributeError):
        yield compiled
        return

    def hook(**kwargs):
        if counting():
            compiled.append(getattr(kwargs.get('fn'), 'name', '?'))
        return previous(**kwargs) if previous is not None else None

    runtime.jit_post_compile_hook = hook
    try:
        yield compiled
    finally:
        runtime.jit_post_compile_hook = previous


def compilations_text(names):
    """'0', or the count and each kernel's: '3 (_dw_conv_kernel, _pola_fwd_keys x2)'."""
    if not names:
        return '0'
    counts = sorted(collections.Counter(names).items())
    return f"{len(names)} ({', '.join(n if c == 1 else f'{n} x{c}' for n, c in counts)})"


def _median(values):
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])


# last-half / first-half median s/iter below which the timed iterations were still getting faster
STILL_FALLING = 0.9


def steadiness(times):
    """Median s/iter of the second half of the timed iterations over that of the first half (None for fewer
    than 4): about 1 in a steady state, below 1 while iterations still get faster (compilation, tuning,
    caches of new shapes filling up)."""
    if len(times) < 4:
        return None
    half = len(times) // 2
    return _median(times[-half:]) / _median(times[:half])


def _size_text(size):
    return '?' if size is None else f'{size[0]}x{size[1]}'


def sizes_summary(times, sizes, new):
    """What the timed iterations' batch input sizes say about their times (a dict): how many distinct sizes, the
    median s/iter of the iterations at a size new to the run and of those at a size seen before (None where there
    are none), and the slowest and fastest iterations with their sizes. Work redone for each new input shape
    (execution plans, kernel variants, compiled graphs) shows as new-size iterations slower than seen-size ones."""
    runs = list(zip(times, sizes, new))
    at_new = [t for t, _, n in runs if n]
    at_seen = [t for t, _, n in runs if not n]
    ranked = sorted(runs, key=lambda run: -run[0])
    return dict(distinct=len(set(sizes)), iterations=len(runs), new=len(at_new),
                new_median=_median(at_new) if at_new else None, seen_median=_median(at_seen) if at_seen else None,
                slowest=ranked[:3], fastest=ranked[-1] if ranked else None)


def sizes_text(summary):
    """One line of :func:`sizes_summary`."""
    def median(value):
        return '-' if value is None else f'{value:.3f}'

    def run(item):
        time_s, size, new = item
        return f"{time_s:.3f} s at {_size_text(size)} ({'new' if new else 'seen'})"

    seen = summary['iterations'] - summary['new']
    return (f"batch input sizes: {summary['distinct']} distinct over {summary['iterations']} timed iterations; "
            f"{summary['new']} at a size new to the run (median {median(summary['new_median'])} s/iter), {seen} at a "
            f"size seen before (median {median(summary['seen_median'])}); slowest "
            + ', '.join(run(item) for item in summary['slowest'])
            + (f"; fastest {run(summary['fastest'])}" if summary['fastest'] is not None else ''))


def again_text(again):
    """One line of :attr:`IterationClock.again`."""
    first, repeated = _median([a['first'] for a in again]), _median([a['again'] for a in again])
    return (f"the same batch again (the last {len(again)} timed iterations at a size new to the run, each run once "
            f"more after the timed ones): median {repeated:.3f} s against {first:.3f} s at its first pass, without "
            f"its loading ({repeated / max(first, 1e-9):.2f}x); " + ', '.join(
                f"{_size_text(a['size'])} {a['first']:.3f} -> {a['again']:.3f} s" for a in again))


def _also_with_readers():
    """{variable: the function that reads and checks it, or None} of the variables ``--also-with`` may set."""
    from mmpola.ops import IMPLEMENTATION_VARIABLES
    return {**IMPLEMENTATION_VARIABLES, 'MMPOLA_TRITON_AUTOTUNE': None}


def variants(args):
    """[None, (variable, value) ...]: each config's own row and one per ``--also-with``, each checked before any
    config runs (an unknown variable or value is one line)."""
    from mmpola.errors import MMPolaUserError
    readers = _also_with_readers()
    found = [None]
    for text in getattr(args, 'also_with', None) or ():
        variable, sep, value = text.partition('=')
        variable, value = variable.strip(), value.strip()
        if not sep or variable not in readers or not value:
            raise SystemExit(f'error: --also-with takes VARIABLE=VALUE with one of {", ".join(readers)}, got {text!r}')
        if readers[variable] is not None:
            with mock.patch.dict(os.environ, {variable: value}):
                try:
                    readers[variable]()
                except MMPolaUserError as error:
                    raise SystemExit(f'error: --also-with {text}: {error}') from None
        if (variable, value) not in found:  # asked twice: one row
            found.append((variable, value))
    return found


def variant_set(variant):
    """A context with ``variant`` (a (variable, value) of :func:`variants`) set in the environment (None: as it
    is), restored after."""
    return contextlib.nullcontext() if variant is None else mock.patch.dict(os.environ, dict([variant]))


def bench_config(spec, args, device, variant=None):
    """Build, run and time one config (with ``variant``, a (variable, value) of ``--also-with``, set in the
    environment while it runs); returns its table row (a dict)."""
    if variant is None:
        return _bench_config(spec, args, device)
    unprofiled = copy.copy(args)
    unprofiled.profile = None  # the config's own row has the profile
    with variant_set(variant):
        row = _bench_config(spec, unprofiled, device)
    row['config'] += f', {variant[0]}={variant[1]}'
    row['variant'] = variant
    return row


def _bench_config(spec, args, device):
    from mmpola.runtime import cli
    with tempfile.TemporaryDirectory(prefix='mmpola_trainbench_') as work_dir:
        cfg, scope, info = prepare_config(spec, args, work_dir)
        runner = cli.build_runner(cfg, 'none', info['notes'])
        profiler = IterationProfiler(device) if args.profile else None
        clock = IterationClock(device, args.warmup, args.iters, profiler)
        for hook in timing_hooks(clock):
            runner.register_hook(hook)
        model_device = next(_unwrap_model(runner.model).parameters()).device
        if model_device.type != device.type:
            raise TrainBenchError(f'the Runner put the model on {model_device}, not on {device} as asked')
        cli.check_train_batches(runner)  # a training set (--data-root) smaller than one batch: its row says so
        with triton_compilations(lambda: clock.timed) as compiled:
            runner.train()
        hooks = [type(h).__name__ for h in runner.hooks if type(h).__module__ != __name__]
        batch = cfg.train_dataloader.batch_size
        if len(clock.iter_times) < args.iters:
            raise TrainBenchError(f'the training data gave {clock.index} iterations, fewer than the '
                                  f'{needed_iterations(args)} asked for')
        row = dict(config=config_label(spec), spec=spec, variant=None, device=_device_name(device), amp=amp_label(cfg),
                   batch=batch,
                   median=_median(clock.iter_times), min=min(clock.iter_times), data=_median(clock.data_times),
                   peak=clock.peak_mib, peak_reset=clock.peak_reset, hooks=hooks, data_info=info['data'],
                   notes=info['notes'], compiled=compiled, allocator=clock.allocator)
        row['images_per_s'] = batch / row['median']
        row['trend'] = steadiness(clock.iter_times)
        row['sizes'] = sizes_summary(clock.iter_times, clock.iter_sizes, clock.iter_new)
        row['again'], row['again_error'] = clock.again, clock.again_error
        if profiler is not None:
            seen = 'a size new to the run' if clock.size_is_new else 'a size seen before'
            details = f"{row['device']}, amp {row['amp']}, batch {batch}, input {_size_text(clock.size)}"
            row['profile'] = write_profile(profiler, clock.profiled_seconds, device, spec, args.profile,
                                           f"{row['config']} ({details}, {seen})")
            if clock.profiler_again is not None:
                row['profile'] += '\n' + write_profile(
                    clock.profiler_again, clock.profiled_again_seconds, device, spec, args.profile,
                    f"{row['config']} ({details}: the same batch again, its size now seen)", stem_suffix='_again')
            write_iterations(clock, spec, args.profile)
        del runner, profiler
    gc.collect()
    if device.type == 'cuda':
        torch.cuda.empty_cache()
    return row


def _device_name(device):
    return 'cuda' if device.type == 'cuda' else 'cpu'


@contextlib.contextmanager
def _one_line_errors(spec, skipped):
    from mmpola.errors import MMPolaUserError
    try:
        yield
    except (TrainBenchError, MMPolaUserError) as error:
        skipped.append(f'{spec}: {error}')
    except (RuntimeError, ValueError) as error:  # e.g. out of memory: the other configs still run
        skipped.append(f'{spec}: training failed: {error_line(error, 300)}')


def bench_train(args, device):
    if args.warmup < 1 or args.iters < 1:
        raise SystemExit('error: --warmup and --iters must be at least 1 (the first iteration builds and caches '
                         'what later ones reuse; it is never timed)')
    ours, _ = mmpola_runtime_hooks()
    hook_text = HOOK_MODE_TEXT[args.hooks].format(hooks=', '.join(_hook_type_name(h) for h in ours))
    rows, skipped = [], []
    rows_of_a_config = variants(args)
    runs = [(spec, variant) for spec in args.configs for variant in rows_of_a_config]
    for i, (spec, variant) in enumerate(runs, 1):
        label = spec if variant is None else f'{spec} with {variant[0]}={variant[1]}'
        with _one_line_errors(label, skipped):
            rows.append(bench_config(spec, args, device, variant))
            r = rows[-1]  # at once, so that a run stopped before the table keeps the configs it finished
            peak = f"{r['peak']:.0f} MiB" if r['peak'] is not None else '-'
            print(f"[{i}/{len(runs)}] {r['config']}: {r['median']:.3f} s/iter (median; min {r['min']:.3f}), "
                  f"peak {peak}" + (f", Triton kernels compiled while timed: {len(r['compiled'])}"
                                    if r['device'] == 'cuda' else ''), flush=True)
            if 'profile' in r:  # at once: a run stopped before its last config keeps the profiles it made
                print('\n' + r['profile'], flush=True)
    if not rows:
        for line in skipped:
            print(f'skipped {line}')
        sys.exit(2)
    scale = f"{args.img_scale[0]}x{args.img_scale[1]} (--img-scale)" if args.img_scale else "the config's"
    print(f'\nTraining throughput: {args.warmup} warm-up + {args.iters} timed iterations, device synchronised '
          f'around each; resize scale: {scale}; no validation, no checkpoints; hooks (--hooks {args.hooks}): '
          f'{hook_text}.')
    compared = len(rows_of_a_config) > 1
    print('\n| config | device | amp | batch | s/iter median | s/iter min | images/s | data s/iter (median) | '
          'peak MiB | 2nd half / 1st half |' + (' median vs own row |' if compared else ''))
    print('|---|---|---|---:|---:|---:|---:|---:|---:|---:|' + ('---:|' if compared else ''))
    own = {}
    for r in rows:
        peak = f"{r['peak']:.0f}" if r['peak'] is not None else '-'
        trend = f"{r['trend']:.2f}" if r['trend'] is not None else '-'
        ratio = ''
        if compared:
            base = own.setdefault(r['spec'], r) if r['variant'] is None else own.get(r['spec'])
            ratio = ' - |' if base is r or base is None else f" {r['median'] / base['median']:.2f}x |"
        print(f"| {r['config']} | {r['device']} | {r['amp']} | {r['batch']} | {r['median']:.3f} | {r['min']:.3f} | "
              f"{r['images_per_s']:.2f} | {r['data']:.3f} | {peak} | {trend} |{ratio}")
    print(f"\ns/iter: from the end of one iteration to the end of the next (its batch's loading, every hook, "
          f"forward, backward, optimizer step). images/s: batch / median s/iter. data: from the end of the "
          f"previous iteration to the first hook of this one. peak: {MEMORY_TEXT[device.type]}. 2nd half / 1st "
          f"half: median s/iter of the last half of the timed iterations over that of the first half (1.00: "
          f"steady; below {STILL_FALLING}: still getting faster)." + (
              ' median vs own row: the median s/iter of a row with --also-with over that of its config\'s own row, '
              'timed just before it in this process.' if compared else ''))
    for r in rows:
        if r['trend'] is not None and r['trend'] < STILL_FALLING:
            print(f"- {r['config']}: still getting faster over the timed iterations (2nd half / 1st half "
                  f"{r['trend']:.2f}): not yet a steady state; raise --warmup (and --iters)")
    for r in rows:
        print(f"- {r['config']}: data: {r['data_info']}; hooks: {', '.join(r['hooks'])}"
              + ('' if r['peak_reset'] else '; peak memory over the whole process (no reset)')
              + (f"; Triton kernels compiled during the timed iterations: {compilations_text(r['compiled'])}"
                 if r['device'] == 'cuda' else ''))
        if r.get('sizes'):
            print(f"  - {sizes_text(r['sizes'])}")
        if r.get('allocator'):
            print(f"  - CUDA caching allocator ({allocator_settings()}) during the timed iterations: "
                  f"{allocator_text(r['allocator'])}")
        if r.get('again'):
            print(f"  - {again_text(r['again'])}")
        if r.get('again_error'):
            print(f"  - a batch could not run again ({r['again_error']}); the timed iterations stand")
        for note in r['notes']:
            print(f'  - {note}')
    if args.profile and rows:
        print(f'\nprofiles (printed after each config\'s line above) written to {args.profile}')
    for line in skipped:
        print(f'skipped {line}')


# --------------------------------------------------------------------------------------------------
# the optimizer's step (``python tools/benchmark.py optim``)
# --------------------------------------------------------------------------------------------------

# torch's optimizer implementations that `optim` compares
OPTIMIZER_IMPLEMENTATIONS = ('foreach', 'fused')


def optimizer_groups(spec, constructor):
    """(the optimizer class, its parameter groups' options with the shapes of their tensors) that
    ``spec``'s optim_wrapper builds with ``constructor`` for the config's model (random weights)."""
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import MODELS

    from mmpola.runtime import config as config_tools

    cfg = config_tools.load_config(resolve_config(spec))
    config_tools.register_task_modules(cfg)
    model = cfg.model
    if model.get('backbone') is not None:
        model.backbone.init_cfg = None
    wrapper = copy.deepcopy(cfg.optim_wrapper)
    wrapper['constructor'] = constructor
    optimizer = build_optim_wrapper(MODELS.build(model), wrapper).optimizer
    groups = [({k: v for k, v in g.items() if k != 'params'}, [p.shape for p in g['params']])
              for g in optimizer.param_groups]
    return type(optimizer), groups


def narrowed_optimizer(spec, constructor, implementation='foreach', full_size=False):
    """(the optimizer, parameter groups, tensors) of ``spec``'s optim_wrapper built by ``constructor`` for the
    config's model, each parameter replaced by a one-element tensor with a gradient (``full_size``: a tensor of
    the parameter's shape, with a random gradient), stepping with torch's ``implementation`` (``'foreach'``,
    torch's default on CUDA, or ``'fused'``, whatever the config sets): its step is the host's share of the
    config's (with ``full_size``, the whole step on the CPU) (``python tools/benchmark.py optim``)."""
    if implementation not in OPTIMIZER_IMPLEMENTATIONS:
        raise ValueError(f'implementation must be one of {OPTIMIZER_IMPLEMENTATIONS}, got {implementation!r}')
    optimizer_cls, groups = optimizer_groups(spec, constructor)
    generator = torch.Generator().manual_seed(0)
    params = [dict(options, foreach=implementation == 'foreach', fused=implementation == 'fused',
                   params=[torch.zeros(shape if full_size else 1, requires_grad=True) for shape in shapes])
              for options, shapes in groups]
    for group in params:
        for p in group['params']:
            p.grad = torch.randn(p.shape, generator=generator) if full_size else torch.zeros(1)
    return optimizer_cls(params), len(groups), sum(len(shapes) for _, shapes in groups)  # the groups hold every option
