"""What ``python tools/benchmark.py host`` builds and counts: the host's time of a backbone's training step, its
compute taken out (the command's loop and table are in tools/benchmark.py). The counting of the operators a call
dispatches (``count_dispatched_ops``: all, the kernels among them, the host-device syncs) also serves ``ops``.

Where a GPU runs a step faster than its Python code and the operators' dispatch can queue the step's kernels,
the host sets the pace: every operator, autograd node, custom Function and Triton launch costs microseconds of
the CPU, whatever the tensors' size. ``backbone --device cuda`` measures that beside each pass's time (its host
column). This command measures the host's share on a machine without a GPU:

* each backbone is built with the layout of the named one (depths, heads, attention kinds, windows, spatial
  reductions, MLP ratios) narrowed to ``HEAD_DIM`` channels per head, so that its operators do almost no work
  on the CPU; the code that runs, and the operators and kernels it dispatches, are those of the full model
  (the choices the layers and ops make by the channel count come out the same at these widths: the tests
  compare the counts with the full models');
* mmpola's backbones run inside a dry run for an H100 (``mmpola.ops.triton_support.dry_run``): the Triton
  paths that a GPU takes by default (the attention kernels, set by ``set_attn_impl('triton')``; the depthwise
  convolutions and the recomputing linear layers, whose ``'auto'`` makes the GPU's choice in a dry run) run
  their launch code and record each launch instead of making it;
* the time is the wall-clock time of a forward and backward (train mode) on one CPU thread: the Python code,
  the dispatch and autograd, and the library operators' CPU kernels at these sizes (a few microseconds each,
  about what a GPU's launch of one costs the host), with denormal floats flushed to zero
  (``denormals_flushed``: the dry run's uninitialised outputs would otherwise slow mmpola's rows alone).
  Triton's own launch path is not in it: the launches are counted apart, and then made once more from
  mmpola's launch call (its direct launches, or Triton's launch path: its autotuners, the binding and
  specialisation of the arguments, the kernel cache, the grid) to a driver that stands in for the GPU's and
  launches nothing (:func:`stand_in_driver`,
  :func:`triton_launch_seconds`), which times the host's cost of the launches but for the launcher's C code and
  the driver's launch call.

Python calls (functions entered, counted by ``sys.setprofile``) and dispatched operators are counts, the same
on every machine; the times depend on the CPU's speed, so compare rows of one run. The operators are counted
with CUDA's autocast op lists (:class:`CudaAutocastLists`), which cast the half inputs of a softmax, a LayerNorm or
a sum to float32 where the CPU's lists do not; the time and the Python calls are the CPU's lists'.
"""
import contextlib
import sys

SYNC_OPS = ('_local_scalar_dense', 'item', 'is_nonzero', 'nonzero')
# operators that launch no kernel on a GPU though the dispatcher does not flag them as views: bare allocations,
# and _unsafe_view (a view that autograd does not track as one: reshape's result after a copy, matmul's)
LAUNCH_FREE_OPS = ('empty', 'empty_like', 'empty_strided', 'new_empty', 'new_empty_strided', '_unsafe_view')

HEAD_DIM = 16  # the Triton attention kernels' smallest head dim

# the heads of timm's layouts (its defaults for these models), which the names' build kwargs do not list
_TIMM_HEADS = {'pvt_v2_b2': (1, 2, 5, 8), 'swin_tiny_patch4_window7_224': (3, 6, 12, 24)}


H100 = dict(gpu=True, capability=(9, 0), sm_count=132, shared_memory=227 * 1024)


def h100_dry_run():
    """mmpola.ops.triton_support.dry_run for an H100 (sm_90, 132 multiprocessors, 227 KiB of shared memory a
    block): a context yielding the list of the Triton launches made inside, recorded instead of made."""
    from mmpola.ops.triton_support import KernelTarget, dry_run
    return dry_run(KernelTarget(**H100))


STAND_IN_DEVICE = 'stand-in'  # the device the stand-in driver says is current


class _StandInUtils:
    """What Triton's launch path asks of its CUDA driver's utilities, answered for a GPU that is not there."""

    def __init__(self, target):
        self.target = target

    def get_device_properties(self, device):
        return dict(max_shared_mem=self.target['shared_memory'], multiprocessor_count=self.target['sm_count'],
                    max_num_regs=65536, warpSize=32)

    def load_binary(self, name, kernel, shared, device):
        return 1, 1, 0, 0, 1024  # stand-ins of the module and function handles, registers, spills, threads a block


class _StandInLauncher:
    """In the place of Triton's launcher of a compiled kernel, which packs the arguments in C and calls the CUDA
    driver's launch (a GPU machine's share that this measure leaves out): nothing."""

    def __init__(self, src, metadata):
        pass

    def __call__(self, *args):
        pass


def stand_in_driver(target=H100):
    """A context in which Triton's active driver stands in for a CUDA GPU of ``target`` (:data:`H100`): Triton's
    launch path runs as on that GPU (its autotuners, the binding and specialisation of the arguments, the kernel
    cache, the grid, the launch metadata), compiling each kernel for it at its first launch (as
    tools/check_triton_kernels.py does; Triton's disk cache keeps them), but nothing is launched: the host's cost
    of Triton's launches on a machine without a GPU, but for its launcher (packing the arguments in C) and the
    driver's launch call. The stand-in's benchmarker times nothing, so each autotuner keeps the first config
    that its pruning leaves; those choices are forgotten after
    (:func:`mmpola.ops.triton_support.choices_kept`), and Triton keeps the kernels loaded for the stand-in apart
    from a real GPU's (:data:`STAND_IN_DEVICE`), so that a process with a GPU launches as before after it. A
    subclass of Triton's CUDA driver (an older or newer Triton without one fails at the import)."""
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.driver import CudaDriver
    from triton.runtime import driver

    class StandInCudaDriver(CudaDriver):

        def __init__(self):  # no CUDA: none of CudaDriver's set-up, which loads the driver's library
            self.utils = _StandInUtils(target)
            self.launcher_cls = _StandInLauncher

        def get_current_device(self):
            return STAND_IN_DEVICE  # Triton keeps its kernels per device: apart from a real GPU's

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            major, minor = target['capability']
            return GPUTarget('cuda', 10 * major + minor, 32)

        def get_benchmarker(self):
            return lambda kernel_call, quantiles=None, **kwargs: [1.0] * len(quantiles) if quantiles else 1.0

    @contextlib.contextmanager
    def active():
        from mmpola.ops.triton_support import choices_kept
        try:
            previous = driver.active
        except RuntimeError:  # no GPU here: Triton makes its driver again when one is asked for
            previous = None
        driver.set_active(StandInCudaDriver())
        try:
            with choices_kept():  # the untimed choices made inside do not outlive it
                yield
        finally:
            driver.set_active(previous)

    return active()


def triton_launch_seconds(launches, repeat):
    """The fastest of ``repeat`` runs of ``launches`` (the :class:`~mmpola.ops.triton_support.Launch` es of one step,
    recorded in a dry run for an H100) down mmpola's and Triton's launch paths to the stand-in driver
    (:func:`stand_in_driver`), after one run that compiles the kernels; inside a dry run for an H100, so that the
    launch code's choices (the autotuners' pruning) are those of the step."""
    import time

    from mmpola.ops.triton_support import relaunch
    best = float('inf')
    with stand_in_driver(), h100_dry_run():
        for index in range(repeat + 1):
            start = time.perf_counter()
            for recorded in launches:
                relaunch(recorded)
            if index:
                best = min(best, time.perf_counter() - start)
    return best if launches else 0.0


def narrowed(type_name, kwargs):
    """(type, build kwargs) of a backbone of ``benchmark.all_backbones()`` (its registered type and build kwargs)
    narrowed to ``HEAD_DIM`` channels per head (module docstring)."""
    kwargs = dict(kwargs)
    if type_name.startswith('timm:'):
        heads = _TIMM_HEADS.get(type_name[5:])
        if heads is None:
            raise ValueError(f'no narrowed layout of {type_name}')
        if type_name[5:].startswith('swin'):  # one width, the first stage's, doubled with the heads
            kwargs.update(embed_dim=HEAD_DIM * heads[0], num_heads=heads)
        else:
            kwargs.update(embed_dims=[HEAD_DIM * h for h in heads], num_heads=heads)
        return type_name, kwargs
    if type_name == 'mmdet.PyramidVisionTransformer':  # stage i has embed_dims * num_heads[i] channels
        kwargs['embed_dims'] = HEAD_DIM
        return type_name, kwargs
    if type_name == 'mmdet.SwinTransformer':
        kwargs['embed_dims'] = HEAD_DIM * kwargs['num_heads'][0]
        return type_name, kwargs
    from mmengine.registry import MODELS

    import mmpola  # noqa: F401 (registers its backbones)
    cls = MODELS.get(type_name)
    arch = dict(cls.arch_settings[kwargs.pop('arch')])
    if isinstance(arch['embed_dims'], int):  # Swin's: the first stage's, doubled with the heads
        arch['embed_dims'] = HEAD_DIM * arch['num_heads'][0]
    else:
        arch['embed_dims'] = [HEAD_DIM * h for h in arch['num_heads']]
    return type_name, dict(kwargs, arch=arch)


# the backbones host times: mmpola's PVT-T and Swin-T layouts (Pola's and softmax), mmdet's PVT-T and Swin-T, timm's
# Swin-T, PVTv2-b2's softmax layout with timm's, FLatten's PVT-T and Swin-T, InLine's PVT-T and PolaFormer++-B2
HOST_BACKBONES = ('pola-pvt-t', 'softmax-pvt-t', 'pvt-t', 'pola-swin-t', 'softmax-swin-t', 'swin-t', 'timm-swin-t',
                  'softmax-pvtv2-b2', 'timm-pvt-v2-b2', 'flatten-pvt-t', 'flatten-swin-t', 'inline-pvt-t',
                  'polaformer++-b2')


def build_narrowed(type_name, kwargs):
    """The narrowed backbone (:func:`narrowed`) in train mode, with the Triton attention where it has one."""
    type_name, kwargs = narrowed(type_name, kwargs)
    if type_name.startswith('timm:'):
        import timm
        model = timm.create_model(type_name[5:], pretrained=False, features_only=True, **kwargs)
    else:
        from get_flops import build_backbone
        model = build_backbone(type_name, **kwargs)
    if hasattr(model, 'set_attn_impl'):  # mmpola's backbones: what 'auto' runs on a GPU
        model.set_attn_impl('triton')
    model.train()
    return model


# CUDA's autocast lists where the CPU's differ (torch's aten/src/ATen/autocast_mode.h: the lower-precision list,
# AT_FORALL_FP32, AT_FORALL_FP32_SET_OPT_DTYPE, the norms that append a dtype, AT_FORALL_PROMOTE), by aten overload:
# on a GPU autocast runs these in float32 whatever their inputs' precision (the CPU's lists run most of them in the
# inputs' dtype: a softmax or a LayerNorm of half tensors keeps half results there, float32 ones on a GPU), these
# in the autocast dtype, and these in their inputs' widest dtype
CUDA_AUTOCAST_OPS = {
    'lower': ('addmv', 'addr', 'mv', 'einsum', 'chain_matmul', 'linalg_multi_dot', 'convolution'),
    'float32': (
        'acos', 'asin', 'cosh', 'erfinv', 'exp', 'expm1', 'log', 'log10', 'log2', 'log1p', 'reciprocal', 'rsqrt',
        'sinh', 'tan', 'pow.Tensor_Scalar', 'pow.Tensor_Tensor', 'pow.Scalar', 'softplus', 'layer_norm',
        'native_layer_norm', 'group_norm', 'frobenius_norm.dim', 'nuclear_norm', 'nuclear_norm.dim',
        'cosine_similarity', 'poisson_nll_loss', 'cosine_embedding_loss', 'nll_loss', 'nll_loss2d',
        'hinge_embedding_loss', 'kl_div', 'l1_loss', 'smooth_l1_loss', 'huber_loss', 'mse_loss', 'margin_ranking_loss',
        'multilabel_margin_loss', 'soft_margin_loss', 'triplet_margin_loss', 'multi_margin_loss',
        'binary_cross_entropy_with_logits', 'dist', 'pdist', 'cdist', 'renorm', 'logsumexp', 'upsample_nearest1d',
        '_upsample_nearest_exact1d', 'upsample_nearest2d', '_upsample_nearest_exact2d', 'upsample_nearest3d',
        '_upsample_nearest_exact3d', 'upsample_linear1d', 'upsample_bilinear2d', '_upsample_bilinear2d_aa',
        'upsample_trilinear3d', 'upsample_bicubic2d', '_upsample_bicubic2d_aa',
        # a dtype of their own, float32 where none is given
        'prod', 'prod.dim_int', 'softmax.int', 'log_softmax.int', 'cumprod', 'cumsum', 'linalg_vector_norm',
        'linalg_matrix_norm', 'linalg_matrix_norm.str_ord', 'sum', 'sum.dim_IntList', 'norm.Scalar',
        'norm.ScalarOpt_dim'),
    'promote': ('addcdiv', 'addcmul', 'atan2', 'bilinear', 'cross', 'dot', 'vdot', 'grid_sampler', 'index_put',
                'tensordot', 'scatter_add'),
}


def _floating(args):
    """The floating-point tensors of ``args`` (and of the lists among them) that autocast may cast: not float64."""
    import torch
    for a in args:
        for t in (a if isinstance(a, (list, tuple)) else (a, )):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64:
                yield t


def _cast(a, dtype):
    import torch
    if isinstance(a, torch.Tensor):
        return a.to(dtype) if a.is_floating_point() and a.dtype not in (dtype, torch.float64) else a
    if isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) for t in a):
        return type(a)(_cast(t, dtype) for t in a)
    return a


def _cuda_autocast_kernel(op, policy):
    """The CPU autocast kernel of aten overload ``op`` under CUDA's ``policy`` ('lower', 'float32', 'promote'):
    the inputs cast as CUDA's autocast casts them, then the op with autocast off (as autocast calls it)."""
    import torch
    # where the op takes a dtype of its own (softmax, sum, ...), its position: a dtype given wins
    own_dtype = next((i for i, a in enumerate(op._schema.arguments) if a.name == 'dtype'), None)

    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)):
            values = [*args, *kwargs.values()]
            if policy == 'lower':
                dtype = torch.get_autocast_dtype('cpu')
            elif policy == 'float32':  # only half inputs change
                given = None if own_dtype is None else (
                    args[own_dtype] if own_dtype < len(args) else kwargs.get('dtype'))
                dtype = torch.float32 if given is None else None
            else:
                dtype = max((t.dtype for t in _floating(values)), key=lambda d: torch.finfo(d).bits, default=None)
            if dtype is not None and any(t.dtype != dtype for t in _floating(values)):
                args = [_cast(a, dtype) for a in args]
                kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
            return op(*args, **kwargs)
    return kernel


class CudaAutocastLists:
    """A context in which the CPU's autocast follows CUDA's op lists (:data:`CUDA_AUTOCAST_OPS`) where they differ
    from the CPU's, so that autograd saves what it saves under a GPU's autocast: a softmax of half scores keeps its
    float32 probabilities (and the product after it their half copy), a LayerNorm of half tokens gives float32
    rows, a loss reads float32 inputs. Each op of those lists gets a kernel for the CPU's autocast dispatch key,
    registered through ``torch.library`` on entering and removed on leaving (the CPU's own autocast kernels, where
    it has some, are what runs again). Outside an autocast region nothing changes."""

    def __enter__(self):
        import warnings

        import torch
        self.library = torch.library.Library('aten', 'IMPL')
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # "overriding a previously registered kernel": the CPU's own, for now
            for policy, names in CUDA_AUTOCAST_OPS.items():
                for name in names:
                    base, _, overload = name.partition('.')
                    op = getattr(getattr(torch.ops.aten, base, None), overload or 'default', None)
                    if op is not None:  # (an op this torch no longer has is not on its lists either)
                        self.library.impl(name, _cuda_autocast_kernel(op, policy), 'AutocastCPU')
        return self

    def __exit__(self, *exc):
        self.library._destroy()


@contextlib.contextmanager
def gpu_autocast(device_type, dtype):
    """``torch.autocast(device_type, dtype)`` (off for ``dtype`` None), with CUDA's op lists on the CPU
    (:class:`CudaAutocastLists`): a count made on the CPU sees what a GPU's autocast dispatches and keeps."""
    import torch
    lists = CudaAutocastLists() if device_type == 'cpu' and dtype is not None else contextlib.nullcontext()
    with torch.autocast(device_type, dtype, enabled=dtype is not None), lists:
        yield


def python_calls(fn):
    """The Python functions entered while ``fn`` runs (``sys.setprofile``'s call events)."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        count += event == 'call'

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(previous)
    return count


def count_dispatched_ops(fn, roofline=None):
    """Run ``fn`` and count the aten operators it dispatches: ``(all, kernels, syncs)``, where kernels
    are the operators that are neither views nor bare allocations (LAUNCH_FREE_OPS; each of the others
    launches work on a GPU) and syncs those that make the host wait for the device there (SYNC_OPS).
    Each kernel is also added to ``roofline`` (a benchmark_roofline.Roofline) when one is given."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        total = kernels = syncs = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            self.total += 1
            name = func.__name__.split('.')[0]
            kernel = not func.is_view and name not in LAUNCH_FREE_OPS
            self.kernels += kernel
            self.syncs += name in SYNC_OPS
            if kernel and roofline is not None:
                roofline.add_operator(func, args, kwargs, out)
            return out

    with Counter() as counter:
        fn()
    return counter.total, counter.kernels, counter.syncs


def step_counts(step, launches):
    """What one call of ``step`` costs the host, counted: (Python calls, aten operators, the kernels among them,
    Triton launches, host-device syncs), ``launches`` being the list of the dry run it runs in (emptied). The
    operators are those that a GPU's autocast dispatches (:class:`CudaAutocastLists`, after one step under them
    that fills the caches of their dtypes); the Python calls those of the step with the CPU's lists, whose
    kernels are not Python functions."""
    calls = python_calls(step)
    with CudaAutocastLists():
        step()
        del launches[:]
        operators, kernels, syncs = count_dispatched_ops(step)
    return calls, operators, kernels, len(launches), syncs


@contextlib.contextmanager
def denormals_flushed():
    """A context in which the CPU reads and writes denormal floats as zero (``torch.set_flush_denormal``; False
    restored after, torch's default, which it has no getter for). A dry run leaves the Triton kernels' outputs
    uninitialised, and the library operators after them compute on whatever bytes those hold: the denormals
    among them slow these operators' CPU kernels, a cost that the step on a GPU does not have and that falls
    on mmpola's rows only. Every row is timed inside, so the rows stay comparable."""
    import torch
    torch.set_flush_denormal(True)  # False where the CPU cannot (not x86 with SSE3): nothing changes there
    try:
        yield
    finally:
        torch.set_flush_denormal(False)
