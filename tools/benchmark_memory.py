"""``python tools/benchmark.py memory``: what a training step of whole configs keeps in a GPU's memory, counted
on the CPU (this module holds its implementation; run it through tools/benchmark.py).

A detector's peak memory in training is what lives through the whole step (the parameters, their gradients, the
optimizer's state), plus what the forward saves for the backward (the activations), plus the transient tensors
and workspaces of the moment of the peak. The first two depend on the model, the input's shape and the dtypes,
not on the device, so they are counted here without a GPU:

* each config is built as the train benchmark builds it (``benchmark_train.prepare_config``: the config's model
  without pretrained weights, its training pipeline on generated data in its dataset's layout, ``--batch-size``,
  ``--img-scale``), and the first batch of its training data goes through the model's data preprocessor;
* the forward of the loss runs once under autocast in ``--amp``'s dtype (as ``tools/train.py --amp`` runs the
  whole model on a GPU), with CUDA's autocast op lists in place of the CPU's where they differ
  (``benchmark_host.CudaAutocastLists``: on a GPU a softmax, a LayerNorm, a sum or a loss of half tensors
  computes and keeps float32 results, on the CPU half ones), inside a dry run for an H100
  (``mmpola.ops.triton_support.dry_run``), mmpola's backbones with the attention's Triton kernels (as ``'auto'``
  runs them on a GPU): mmpola's ops make the choices they make on that GPU (the attention's and the depthwise
  convolutions' Triton kernels; with ``MMPOLA_RECOMPUTE=triton`` the linear layers that recompute their input),
  their launches recorded instead of made;
* the CPU computes the half-precision convolutions and matrix products in float32 (:class:`HalfProductsInFloat32`,
  below autograd: the tensors saved are the same, only the values' last bits differ), because its half-precision
  kernels are far slower;
* the storages that autograd saves for the backward are counted once each, for the part of the model that saved
  them first: the backbone, the neck, the rest (heads and losses);
* the backbone's outputs are replaced by zeros before the neck, on every config (:func:`_parts_tracked`): a
  dry run leaves the Triton kernels' outputs unset, and the heads' data-dependent work (proposals, sampled
  regions, positives) follows what the features hold. With the same zero features, the same data (``--seed``)
  and the same neck and heads, their weights drawn again after one seed
  (:func:`same_weights_beyond_the_backbone`), two detectors that differ in their backbone keep the same in the
  rest, and their difference is the backbones';
* mmcv's ``RoIAlign`` layers run torchvision's ``roi_align`` (their own ``use_torchvision`` option,
  :func:`roi_layers_on_torchvision`): mmcv's CPU kernel takes no half-precision features; and a region
  proposal network's scores are float32 from its classifier on (:func:`_parts_tracked`), for mmcv's CPU NMS;
* parameters, their gradients (one per trainable parameter, in its dtype) and the optimizer's state after one
  step of the optimizer that the config's ``optim_wrapper`` builds (AdamW: two moments per trainable parameter).

Where a GPU would take another path than the CPU, the count is the CPU's: mmpola's softmax windows with a learned
bias (Swin's) run the explicit steps here (``softmax_attention``), keeping their probabilities in half, where a
GPU's fused attention keeps the output and the mask instead (about as many bytes).

Not counted: the transient tensors (the widest of the forward and the backward, the activations' gradients),
cuDNN's and the libraries' workspaces, the caching allocator's rounding and fragmentation. A GPU's own figure is
``train --device cuda`` (``torch.cuda.max_memory_allocated()``); this one is the same on every machine and
compares two models' lasting share of it.
"""
import contextlib
import copy
import gc
import logging
import os
import tempfile

import torch

PARTS = ('backbone', 'neck', 'rest')


def saved_for_backward(fn, part=None, aliases=None):
    """Run ``fn`` and return (its result, {part: bytes}) of the distinct storages that autograd saves for backward
    meanwhile, each counted once, for the part that ``part()`` names when it is first saved (``part`` None: one
    part, ``None``): the activation memory a training step holds from its forward to its backward, whatever the
    device (the tensors of a dry run included: their storages exist, uninitialised). The storages are kept until
    the count is made, so that a freed one's memory reused by a later one is not taken for the same.
    ``aliases``: {a storage's data pointer: (its tensor, the storage counted in its place)}."""
    storages, totals, aliases = {}, {}, aliases if aliases is not None else {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storage = aliases.get(storage.data_ptr(), (None, storage))[1]
        if storage.data_ptr() not in storages:
            storages[storage.data_ptr()] = storage
            label = None if part is None else part()
            totals[label] = totals.get(label, 0) + storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        result = fn()
    storages.clear()
    return result, totals


class HalfProductsInFloat32:
    """A context in which the CPU computes the half-precision convolutions and matrix products in float32,
    rounding their results back to the inputs' dtype: the CPU's kernels for float16 / bfloat16 products are many
    times slower than its float32 ones (more than a hundred times for a convolution), and the count does not
    need the values. Below autograd (a ``__torch_dispatch__`` mode), so autograd saves the same tensors, of the
    same dtypes, as with the half-precision kernels; only the results' last bits differ."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        aten = torch.ops.aten
        products = {aten.convolution.default, aten.addmm.default, aten.mm.default, aten.bmm.default,
                    aten.baddbmm.default}
        halves = (torch.float16, torch.bfloat16)

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                tensors = [a for a in args if torch.is_tensor(a)]
                if func not in products or not tensors or tensors[0].dtype not in halves:
                    return func(*args, **kwargs)
                dtype = tensors[0].dtype
                widened = [a.float() if torch.is_tensor(a) else a for a in args]
                return func(*widened, **kwargs).to(dtype)

        self.mode = Mode()

    def __enter__(self):
        return self.mode.__enter__()

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


def _tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def lasting_bytes(model, optim_wrapper_cfg):
    """(parameters, gradients, optimizer state) bytes of ``model`` trained with ``optim_wrapper_cfg`` (an
    optim_wrapper config): the state counted after one step of the optimizer it builds (zero gradients; the
    wrapper's type set to mmengine's ``OptimWrapper``, which builds the same optimizer without mixed precision's
    loss scaling, a device-independent part of it). The model's parameters are restored after the step."""
    from mmengine.optim import build_optim_wrapper

    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    wrapper_cfg = copy.deepcopy(optim_wrapper_cfg)
    wrapper_cfg['type'] = 'OptimWrapper'
    for key in ('loss_scale', 'dtype'):  # AmpOptimWrapper's own options
        wrapper_cfg.pop(key, None)
    saved = [p.detach().clone() for p in params]
    optimizer = build_optim_wrapper(model, wrapper_cfg).optimizer
    for p in trainable:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    state = _tensor_bytes(t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    with torch.no_grad():
        for p, value in zip(params, saved):
            p.copy_(value)
            p.grad = None
    return _tensor_bytes(params), _tensor_bytes(trainable), state


@contextlib.contextmanager
def _parts_tracked(model):
    """A context yielding (a function that names the part of ``model`` running now: 'backbone', 'neck' or 'rest';
    the aliases of :func:`saved_for_backward`), from forward hooks on the model's ``backbone`` and ``neck``. The
    backbone's output tensors are replaced by zeros of their shapes and strides, each an alias of the output's
    storage: the neck saving one keeps what saving the output would keep (nothing more where the backbone saved
    it too). Zeroing the outputs in place could not do: one may be a view among several that a function returns,
    which autograd refuses to see changed. A region proposal network's classification scores are made float32
    where its convolution gives them: the proposals' NMS (mmcv's CPU kernel) takes no half precision, and the
    loss, which saves them, takes float32 under a GPU's autocast too (binary cross-entropy with logits)."""
    stack, handles, aliases = [], [], {}

    def left(module, args, outputs):  # returns None: the outputs stay the module's
        stack.pop()

    def zeroed(module, args, outputs):
        def zero(out):
            if not torch.is_tensor(out):
                return out
            replacement = torch.zeros_like(out).requires_grad_(out.requires_grad)
            aliases[replacement.untyped_storage().data_ptr()] = (replacement, out.untyped_storage())
            return replacement
        return type(outputs)(zero(o) for o in outputs) if isinstance(outputs, (list, tuple)) else zero(outputs)

    def in_float32(module, args, outputs):
        return outputs.float()

    classifier = getattr(getattr(model, 'rpn_head', None), 'rpn_cls', None)
    if isinstance(classifier, torch.nn.Module):
        handles.append(classifier.register_forward_hook(in_float32))
    for name in PARTS[:2]:
        module = getattr(model, name, None)
        if isinstance(module, torch.nn.Module):
            handles.append(module.register_forward_pre_hook(lambda m, a, name=name: stack.append(name)))
            handles.append(module.register_forward_hook(left))
            if name == 'backbone':
                handles.append(module.register_forward_hook(zeroed))
    try:
        yield (lambda: stack[-1] if stack else 'rest'), aliases
    finally:
        for handle in handles:
            handle.remove()


def roi_layers_on_torchvision(node):
    """Set ``use_torchvision=True`` on every mmcv ``RoIAlign`` layer config under ``node`` (a config or a part of
    it); returns how many. mmcv's CPU kernel takes float32 features only, torchvision's ``roi_align`` takes
    them under autocast (computing in float32, returning the features' dtype); both keep the regions for the
    backward, not the features."""
    from mmpola.runtime.config import config_dicts
    found = [entry for entry in config_dicts(node) if entry.get('type') == 'RoIAlign']
    for entry in found:
        entry['use_torchvision'] = True
    return len(found)


def same_weights_beyond_the_backbone(model, seed):
    """Draw the weights of every part of ``model`` but its backbone (and data preprocessor) again after one seed,
    in the modules' order (their ``reset_parameters``): two detectors with the same neck and heads get the same
    weights there, whatever their backbones drew before."""
    torch.manual_seed(seed)
    for name, child in model.named_children():
        if name in ('backbone', 'data_preprocessor'):
            continue
        for module in child.modules():
            if callable(getattr(module, 'reset_parameters', None)):
                module.reset_parameters()


def step_memory(spec, args, variant=None):
    """One row: the lasting bytes and the saved activations of ``spec``'s training step (see the module doc),
    with ``variant`` (a (variable, value) of ``--also-with``) set in the environment while it runs."""
    from benchmark_host import denormals_flushed, gpu_autocast, h100_dry_run
    from benchmark_train import builds_mmpola_backbone, config_label, prepare_config, variant_set
    from mmengine.registry import MODELS
    from mmengine.runner import Runner, set_random_seed

    built_args = copy.copy(args)
    # data for four batches: enough images that an aspect-ratio batch sampler (mmdet's) groups the first batch of
    # one orientation, as it groups a real dataset's batches, rather than padding a wide and a tall image together
    built_args.warmup, built_args.iters, built_args.profile, built_args.amp = 0, 4, None, False
    # mmpola's backbones: the attention's Triton kernels, as 'auto' runs them on a GPU (the dry run records them)
    built_args.hooks, built_args.data_root, built_args.attn_impl = 'config', None, 'triton'
    amp_dtype = getattr(torch, args.amp)
    with tempfile.TemporaryDirectory(prefix='mmpola_memory_') as work_dir, variant_set(variant):
        cfg, _, info = prepare_config(spec, built_args, work_dir)
        if variant is not None and not builds_mmpola_backbone(cfg.model.get('backbone') or {}):
            return None  # another library's backbone reads none of mmpola's variables: the same row again
        loader_cfg = copy.deepcopy(cfg.train_dataloader)
        loader_cfg.update(num_workers=0, persistent_workers=False)
        set_random_seed(args.seed)  # the pipeline's random choices: the same batch for every config of a dataset
        batch = next(iter(Runner.build_dataloader(loader_cfg, seed=args.seed)))
        set_random_seed(args.seed)
        roi_layers_on_torchvision(cfg.model)
        model = MODELS.build(cfg.model)
        model.train()
        same_weights_beyond_the_backbone(model, args.seed)
        params, grads, state = lasting_bytes(model, cfg.optim_wrapper)
        data = model.data_preprocessor(batch, True)
        height, width = data['inputs'].shape[-2:]
        set_random_seed(args.seed)  # the samplers' draws: alike on every config
        with _parts_tracked(model) as (part, aliases), h100_dry_run(), denormals_flushed(), \
                HalfProductsInFloat32(), gpu_autocast('cpu', amp_dtype):
            _, saved = saved_for_backward(lambda: model(**data, mode='loss'), part, aliases)
    label = config_label(spec) + ('' if variant is None else f', {variant[0]}={variant[1]}')
    return dict(config=label, input=f'{height}x{width}', batch=cfg.train_dataloader.batch_size, params=params,
                grads=grads, state=state, saved={p: saved.get(p, 0) for p in PARTS},
                notes=[note for note in info['notes'] if note.startswith('--cfg-options')])


def total(row):
    return row['params'] + row['grads'] + row['state'] + sum(row['saved'].values())


def _mib(nbytes):
    return f'{nbytes / 2**20:.1f}'


def bench_memory(args, device):
    from benchmark_train import TrainBenchError, error_line, variants
    from mmengine.logging import MMLogger

    from mmpola.errors import MMPolaUserError
    os.environ['MMPOLA_NO_COMPILE'] = '1'  # as ops: nothing runs the fast path's compiled kernels in a dry run
    MMLogger.get_current_instance().setLevel(logging.WARNING)  # the table is the output, not the builders' notes
    if device.type != 'cpu':
        raise SystemExit("memory counts a GPU's training step on the CPU (a dry run); on a GPU, `train --device cuda` "
                         'measures the peak memory of real iterations')
    if args.pairs and len(args.configs) % 2:
        raise SystemExit(f'error: --pairs takes the configs two by two (each with its counterpart), got '
                         f'{len(args.configs)}')
    groups = []  # per config: its own row, then one per --also-with (mmpola's backbones only)
    for spec in args.configs:
        groups.append([])
        for variant in variants(args):
            try:
                row = step_memory(spec, args, variant)
                gc.collect()  # the model and its saved tensors, before the next config's
            except (TrainBenchError, MMPolaUserError, RuntimeError, ValueError) as error:
                raise SystemExit(f'error: {spec}: {error_line(error, 300)}') from None
            if row is None:
                continue
            groups[-1].append(row)
            print(f"[{sum(map(len, groups))}] {row['config']}: {_mib(total(row))} MiB", flush=True)
    print(f'\nWhat a training step keeps on a GPU, counted on the CPU: autocast {args.amp}, one batch of generated '
          'data through each config\'s training pipeline, in a dry run for an H100 (mmpola\'s ops as on that GPU); '
          'MiB.')
    print('\n| config | input | batch | params | grads | optimizer state | saved: backbone | saved: neck | '
          'saved: rest | total |' + (' total vs its pair\'s | backbone saved vs its pair\'s |' if args.pairs else ''))
    print('|---|---|---:|---:|---:|---:|---:|---:|---:|---:|' + ('---:|---:|' if args.pairs else ''))
    for i, group in enumerate(groups):
        other = groups[i + 1][0] if args.pairs and i % 2 == 0 else None  # the counterpart's own row
        for r in group:
            cells = ''
            if args.pairs:
                cells = (' - | - |' if other is None else f" {total(r) / total(other):.2f}x | "
                         f"{r['saved']['backbone'] / other['saved']['backbone']:.2f}x |")
            print(f"| {r['config']} | {r['input']} | {r['batch']} | {_mib(r['params'])} | {_mib(r['grads'])} | "
                  f"{_mib(r['state'])} | {_mib(r['saved']['backbone'])} | {_mib(r['saved']['neck'])} | "
                  f"{_mib(r['saved']['rest'])} | {_mib(total(r))} |" + cells)
    print('\nparams, grads: the bytes of the parameters and of one gradient per trainable parameter; optimizer state: '
          "after one step of the config's optimizer; saved: the distinct storages autograd saves for the backward "
          'in the forward of the loss, by the part that saved them first (rest: heads and losses), the backbone\'s '
          'outputs replaced by zeros before the neck on every config (the heads\' data-dependent work then alike); '
          'total: their sum, the part of the peak that lasts through the step (transient tensors, workspaces and the '
          'allocator\'s rounding come on top).' + (
              ' vs its pair\'s: over the next config\'s own row (--pairs: each config followed by its counterpart).'
              if args.pairs else ''))
    for note in dict.fromkeys(note for group in groups for r in group for note in r['notes']):
        print(f'- every config: {note}')
