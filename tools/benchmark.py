#!/usr/bin/env python3
"""Benchmarks of the attention cores, of whole backbones (time, peak memory, FLOP rate) and of training.

    python tools/benchmark.py attention                 # cores (Pola, FLatten, InLine): reference vs fast
    python tools/benchmark.py attention --cases pvt-s1@800x1344 --impls reference fast
    python tools/benchmark.py attention --kinds flatten inline --cases pvt-s1@800x1344 swin-s1@800x1344
    python tools/benchmark.py attention --kinds pacs --cases pvt-s1@800x1344   # PolaFormer++'s PaCS core
    python tools/benchmark.py backbone                  # Pola-PVT-T/S, Pola-Swin-T vs mmdet PVT-T, Swin-T
    python tools/benchmark.py backbone --models pola-pvt-t swin-t --sizes 224 800x1333
    python tools/benchmark.py backbone --models all --sizes 224 800x1333 --no-memory  # every backbone
    python tools/benchmark.py backbone --models pola-pvt-t softmax-pvt-t --sizes 800x1344 --batch 2 --backward \
        --profile DIR                                   # ... and one more pass of each row under torch.profiler,
                                                        # summarised as train's --profile does
    python tools/benchmark.py scaling                   # Pola-PVT-T 800x1333 -> 1600x2666 time growth
    python tools/benchmark.py ops                       # aten operators / kernels / syncs of one fwd+bwd
    python tools/benchmark.py ops --attn-impl triton --amp bfloat16 --roofline h200
                                                        # ... as a GPU runs it, and a lower bound of its device
                                                        # time there (tools/benchmark_roofline.py), on the CPU
    python tools/benchmark.py amp                       # bf16 (CPU) / fp16+bf16 (CUDA) autocast fwd+bwd
                                                        # of every full-size backbone at 800x1216
    python tools/benchmark.py layers --device cuda --cases pvt-s1@800x1344 swin-s1@800x1344
                                                        # the value path's depthwise 5x5 conv alone, fwd and
                                                        # bwd, library (channels-last, contiguous) vs Triton,
                                                        # fp32/bf16/fp16, and at shapes not seen before; PVT
                                                        # cases also time the spatial-reduction conv
    python tools/benchmark.py train CONFIG [CONFIG ...] --iters 20 --warmup 5 --device cuda [--amp]
        [--batch-size B] [--data-root DIR] [--img-scale W H] [--hooks mmpola|library|config] [--profile DIR]
                                                        # training throughput of whole configs, e.g.
    python tools/benchmark.py train configs/detection/retinanet_pola-pvt-t_fpn_1x_coco.py \
        mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py --device cpu --iters 3 --warmup 1 --img-scale 320 256
    python tools/benchmark.py memory configs/detection/retinanet_pola-pvt-t_fpn_1x_coco.py \
        mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py --pairs --batch-size 2 --also-with MMPOLA_RECOMPUTE=triton
                                                        # what a training step of each config keeps on a GPU
                                                        # (parameters, gradients, optimizer state, saved
                                                        # activations by part), counted on the CPU in a dry
                                                        # run (tools/benchmark_memory.py)

Prints Markdown tables (and the environment: torch, device, threads, dtype, seed, load) and asserts
nothing. Times are taken over --repeat runs after one warm-up (attention: more runs for fast cases);
implementations are interleaved within each repetition so that load from other processes affects them
alike. The attention table reports min and median: on a shared machine the min is the better estimate
of the code's own cost, the median shows the interference.

Peak memory:
* CPU: peak resident set size above the baseline taken after the inputs (and model) exist, in a fresh
  subprocess per row: after a warm-up pass, freed memory is returned to the OS (malloc_trim), the
  kernel's high-water mark is reset (/proc/self/clear_refs = 5), the pass runs once and VmHWM minus the
  baseline RSS is reported. glibc's mmap threshold is pinned to 64 KiB in that subprocess so that every
  tensor is its own mapping and freed tensors leave the RSS at once (tensors are what we measure, not
  the allocator's caching). Includes everything the pass touches: activations, gradients of the inputs,
  temporaries, oneDNN/BLAS scratch.
* CUDA: torch.cuda.max_memory_allocated() above the memory allocated before the pass, in-process.

The cases are data, read from the package's registries and tables: the attention ops, their
implementations and example inputs (mmpola.ops.OPS: a new op or a registered implementation appears
here), and the backbones (every preset of mmpola.models.backbones.PRESETS at every arch size of its
architecture, named '<official name>-<size>': pola-pvt-t, flatten-swin-b, flatten-pvtv2-b0,
inline-cswin-b-384, inline-deit-s, polaformer++-b2 ...; every kind every architecture takes, and its
softmax (kind_rows()), on every architecture at its first size, named the same way: pola-cswin-t,
softmax-deit-t ...; the rows of EXTRA_BACKBONES; mmdet's PVT-T and Swin-T as references).

Training throughput (train; tools/benchmark_train.py holds it): each config's Runner built as
tools/train.py builds it (model, optimizer wrapper and --amp, parameter schedulers, hooks), on generated
data in the layout of its dataset (COCO-format with 5-15 objects per COCO-sized image and the config's
classes for mmdet configs, ADE20K-layout scenes for mmseg configs; --data-root: real data), without
pretrained weights, validation or checkpoints; the same hooks on every config (--hooks). s/iter
(median, min) of the timed iterations with the device synchronised around each, images/s, data time,
peak memory (CUDA: max_memory_allocated; CPU: peak RSS). --profile DIR: one more iteration under
torch.profiler: DIR/<config>_trace.json (chrome trace) and a summary (DIR/<config>_profile.md, also
printed, and .json): device time, kernels (CUDA) or aten ops (CPU), host-device syncs, the top 15 ops,
time per part (backbone, neck, each head with its loss, backward, optimizer step). Configs are files or
mmdet::/mmseg:: configs of the installed packages; one that cannot run is one 'skipped' line.

Implementations of a core (--impls): 'reference' (official op order), 'fast' (fast path, eager:
MMPOLA_NO_COMPILE=1), any other registered implementation, 'fast+compile' (the fast path with its
torch.compile kernels forced at every size, for ops that have them: Pola); 'auto' is what models use
by default (fast, compiled for inputs of >= 2**20 elements). An implementation an op does not have is
skipped. Kinds (--kinds): the ops, 'pola', 'flatten', 'inline', 'pacs' (PolaFormer++; the pvt-s* cases
are the shapes of PolaPP-B2's stages 1 and 2: C = 64 / 128, head dim 64).
"""
import argparse
import contextlib
import ctypes
import functools
import gc
import json
import os
import os.path as osp
import platform
import statistics
import subprocess
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TOOLS = osp.dirname(osp.abspath(__file__))
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)
import _mmpola_tools  # noqa: E402,F401  (the tools' shared start, before torch: --device cpu hides the GPUs)
import torch  # noqa: E402
from benchmark_host import (  # noqa: E402
    HEAD_DIM,
    HOST_BACKBONES,
    LAUNCH_FREE_OPS,
    SYNC_OPS,
    build_narrowed,
    count_dispatched_ops,
    denormals_flushed,
    gpu_autocast,
    h100_dry_run,
    python_calls,
    step_counts,
    triton_launch_seconds,
)
from benchmark_memory import bench_memory, saved_for_backward  # noqa: E402

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# name: (batch, heads, token grid H x W, head dim d); channels C = heads * d. Tokens N = n = H * W.
ATTENTION_CASES = {
    'pvt-s1@800x1344': (2, 1, (200, 336), 64),  # Pola-PVT stage 1, C = 64
    'swin-s1@800x1344': (2, 3, (200, 336), 32),  # Pola-Swin-T stage 1, C = 96
    'pvt-s2@800x1344': (2, 2, (100, 168), 64),  # Pola-PVT stage 2, C = 128
    'swin-s2@800x1344': (2, 6, (100, 168), 32),  # Pola-Swin-T stage 2, C = 192
    'polapp-b4-s1@800x1344': (2, 1, (200, 336), 96),  # PolaFormer++-B4 / B5 stage 1, C = 96 (PaCS's wide heads)
    'pvt-s1@224': (2, 1, (56, 56), 64),
    'swin-s1@224': (2, 3, (56, 56), 32),
}
# what `attention` runs without --cases (the tables of docs/benchmarks.md): every case but PaCS's widest heads,
# which a GPU run asks for by name with --kinds pacs
DEFAULT_ATTENTION_CASES = [case for case in ATTENTION_CASES if case != 'polapp-b4-s1@800x1344']
COMPILE = 'fast+compile'  # the fast path with its torch.compile kernels forced at every size

# backbones besides the presets at their arch sizes, name: (registered type, build kwargs): released
# settings of another pretraining size, and the references of other libraries
EXTRA_BACKBONES = {
    'pola-swin-b-384': ('PolaSwin', dict(arch='base', pretrain_img_size=384)),
    'softmax-pvtv2-b2': ('PVTv2Backbone', dict(arch='b2', attn_type='SSSS')),  # timm-pvt-v2-b2's network
}
REFERENCE_BACKBONES = {
    'pvt-t': ('mmdet.PyramidVisionTransformer', dict(num_layers=[2, 2, 2, 2])),
    'swin-t': ('mmdet.SwinTransformer', dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                                             window_size=7)),
}
# timm's networks as references of mmpola's softmax layouts: 'timm:<model name>' types, built with
# features_only at the input size, with stochastic depth as mmpola's layout of the same network has it (timm's
# pvt_v2_b2 has none by default; its swin_tiny has 0.1), so that both do the same work in training
REFERENCE_BACKBONES.update({
    'timm-pvt-v2-b2': ('timm:pvt_v2_b2', dict(drop_path_rate=0.1)),
    'timm-swin-t': ('timm:swin_tiny_patch4_window7_224', dict(strict_img_size=False)),
})
DEFAULT_BACKBONES = ('pola-pvt-t', 'pola-pvt-s', 'pola-swin-t', 'pvt-t', 'swin-t')
BACKBONE_SIZES = ('224', '512', '800x1333', '1024', '1600')

CPU_MEMORY_METHOD = ('peak RSS above the post-setup baseline, fresh subprocess per row '
                     '(VmHWM after clear_refs, glibc mmap threshold 64 KiB)')
CUDA_MEMORY_METHOD = 'torch.cuda.max_memory_allocated() above the pre-pass allocation'


# --------------------------------------------------------------------------------------------------
# the cases, from the registries
# --------------------------------------------------------------------------------------------------


def attention_ops():
    """``{op name: mmpola.ops.dispatch.AttentionOp}`` of every registered attention op."""
    from mmpola.ops import OPS
    return dict(OPS)


def attention_impls(kind):
    """The implementations the benchmark runs for an op: its registered ones, 'auto', and
    'fast+compile' when its fast path compiles."""
    op = attention_ops()[kind]
    return list(op.names()) + ([COMPILE] if op.force_compile is not None else [])


def _size_name(arch):
    """tiny -> t, b2 -> b2, base_384 -> b-384."""
    first, *rest = arch.split('_')
    return '-'.join([first if len(first) <= 2 else first[0]] + rest)


def released_backbones():
    """``{name: (registered type, build kwargs)}``: every preset at every arch size of its architecture."""
    from mmpola.models.backbones import PRESETS
    from mmpola.registry import ARCHITECTURES
    out = {}
    for preset in PRESETS:
        for arch in ARCHITECTURES.get(preset.family).arch_settings:
            out[f'{preset.official.lower()}-{_size_name(arch)}'] = (preset.name, dict(arch=arch))
    return out


def kind_rows():
    """The attention kinds compared on every architecture (besides its released presets): the
    registered kinds every architecture takes, and 'softmax' (each architecture's own)."""
    from mmpola.models.backbones import kinds_on_every_architecture
    return kinds_on_every_architecture() + ('softmax',)


def kind_backbones():
    """``{name: (registered type, build kwargs)}``: every kind of :func:`kind_rows` on every architecture
    that takes it, at the architecture's first size, where no preset is that pair (PolaFormer++ keeps its
    own kinds)."""
    from mmpola.models.attention import attention_title
    from mmpola.models.backbones import preset_of
    from mmpola.registry import ARCHITECTURES
    out = {}
    for family, arch_cls in ARCHITECTURES.module_dict.items():
        if family == 'polapp':
            continue
        arch = next(iter(arch_cls.arch_settings))
        for kind in kind_rows():
            if kind == 'softmax':
                stages = arch_cls.stages_of(arch_cls.arch_settings[arch])
                kwargs = dict(arch=arch, attn_type='S' * (1 if family == 'vit' else stages))
                title = 'softmax'
            elif preset_of(family, kind) is None and arch_cls.accepts_kind(kind):
                kwargs = dict(arch=arch, attn=dict(type=kind))
                title = attention_title(kind)
            else:
                continue
            out[f'{title.lower()}-{arch_cls.title.lower()}-{_size_name(arch)}'] = (arch_cls.__name__, kwargs)
    return out


def all_backbones():
    return {**released_backbones(), **kind_backbones(), **EXTRA_BACKBONES, **REFERENCE_BACKBONES}


def pola_backbones():
    """Every size of the PolaFormer presets (Pola-PVT, Pola-Swin) and the extras: the amp check's default."""
    return [name for name in all_backbones() if name.startswith('pola-')]


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------


def parse_size(text):
    """'224' -> (224, 224); '800x1333' -> (800, 1333)."""
    parts = text.lower().split('x')
    if len(parts) == 1:
        return int(parts[0]), int(parts[0])
    if len(parts) == 2:
        return int(parts[0]), int(parts[1])
    raise argparse.ArgumentTypeError(f'size must be S or HxW, got {text!r}')


def cpu_name():
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cuda_device_line(device):
    """The GPU, its compute capability and the CUDA, cuDNN and Triton versions the figures were made with (which
    kernels torch and Triton choose depends on them: e.g. torch tries cuDNN's attention first on compute capability
    9.0 / 10.0 with a recent cuDNN)."""
    major, minor = torch.cuda.get_device_capability(device)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = 'not installed'
    return (f'device: {torch.cuda.get_device_name(device)} (compute capability {major}.{minor}), CUDA '
            f'{torch.version.cuda}, cuDNN {cudnn}, Triton {triton_version}')


def environment_lines(args, device):
    from mmpola.ops import depthwise_conv_impl, pola, recompute_impl, sdpa_impl
    # the kernel's release too: a GPU machine's host may run in a sandbox whose system calls cost more
    lines = [f'torch {torch.__version__}, python {platform.python_version()}, {platform.system()} {platform.release()}']
    if device.type == 'cuda':
        lines.append(cuda_device_line(device))
    # on a GPU too: where the host sets the pace of a step, its CPU is part of the figure
    lines.append(f"{'host' if device.type == 'cuda' else 'device'}: CPU {cpu_name()} ({os.cpu_count()} logical cores)")
    if hasattr(os, 'getloadavg'):
        lines.append('load average (1/5/15 min) at start: %.2f %.2f %.2f' % os.getloadavg())
    if args.command == 'train':
        lines.append(f'threads: {torch.get_num_threads()}, dtype: {"--amp (per row)" if args.amp else "float32"}, '
                     f'seed: {args.seed}, {args.iters} timed iterations after {args.warmup} warm-up')
    else:
        dtype = ('autocast (per row)' if args.command == 'amp' else
                 f'autocast {args.amp}' if getattr(args, 'amp', None) else 'float32')
        lines.append(f'threads: {torch.get_num_threads()}, dtype: {dtype}, seed: {args.seed}, '
                     f'repeat: >= {args.repeat} after {getattr(args, "warmup", 1)} warm-up')
    lines.append(f'torch.compile for the fast path: {pola.compile_status()[1]}')
    lines.append(f"mmpola's depthwise convolutions: {depthwise_conv_impl()} (MMPOLA_DEPTHWISE_CONV; 'auto': Triton "
                 'kernels on CUDA, the library convolution elsewhere)')
    lines.append(f"linear layers of the MLPs and gates, and after LayerNorms: {recompute_impl()} (MMPOLA_RECOMPUTE; "
                 "'auto': the library's layers; 'triton': on CUDA the backward recomputes their input in Triton "
                 "kernels, keeping less; 'elementwise': the kernels for the MLPs' GELU, and for the gates that the "
                 "attention's kernels do not multiply)")
    lines.append(f"the softmax kinds' scaled_dot_product_attention: {sdpa_impl()} (MMPOLA_SDPA; 'auto': on CUDA "
                 "torch's backends without cuDNN's attention, which builds a graph per input size; 'torch': torch's "
                 "choice)")
    if device.type == 'cpu':
        lines.append(f'glibc malloc tuning (mmpola.runtime.allocator): {getattr(args, "malloc_state", "n/a")}')
    if args.command == 'train':
        from benchmark_train import MEMORY_TEXT
        lines.append('peak memory: ' + MEMORY_TEXT[device.type])
    elif getattr(args, 'memory', True):
        lines.append('peak memory: ' + (CUDA_MEMORY_METHOD if device.type == 'cuda' else CPU_MEMORY_METHOD))
    return lines


@contextlib.contextmanager
def core_impl(kind, impl):
    """Select an implementation of op ``kind``; yields the ``impl`` argument of the op ('fast' runs
    eager, 'fast+compile' with the op's compiled kernels forced at every size)."""
    previous_env = os.environ.get('MMPOLA_NO_COMPILE')
    try:
        if impl == COMPILE:
            with attention_ops()[kind].force_compile():
                yield 'fast'
            return
        if impl == 'fast':
            os.environ['MMPOLA_NO_COMPILE'] = '1'
        yield impl
    finally:
        if previous_env is None:
            os.environ.pop('MMPOLA_NO_COMPILE', None)
        else:
            os.environ['MMPOLA_NO_COMPILE'] = previous_env


def synchronize(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def time_pass(fn, device):
    """(seconds of ``fn`` with the device synchronised around it, seconds until ``fn`` returned): on a GPU the
    second is the host's own time (the Python code and the launches it queues); the two are close where the
    host, not the device, sets the pace."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    queued = time.perf_counter()
    synchronize(device)
    return time.perf_counter() - start, queued - start


def time_once(fn, device):
    return time_pass(fn, device)[0]


def median(values):
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])


def _proc_status_kib(key):
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(key + ':'):
                return int(line.split()[1])
    raise KeyError(key)


def _release_freed_memory():
    gc.collect()
    try:
        ctypes.CDLL('libc.so.6').malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_memory_mib(fn, device):
    """Extra peak memory (MiB) of one call of ``fn`` beyond what is allocated now (see module doc)."""
    if device.type == 'cuda':
        synchronize(device)
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base) / 2**20
    _release_freed_memory()
    base = _proc_status_kib('VmRSS')
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')  # reset VmHWM to the current RSS
    fn()
    return (_proc_status_kib('VmHWM') - base) / 1024


def cpu_peak_supported():
    return sys.platform.startswith('linux') and osp.exists('/proc/self/clear_refs')


def run_peak_subprocess(spec, threads):
    """Run ``benchmark.py _peak SPEC`` in a fresh process; returns its dict (values in MiB) or an error."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_='65536')
    cmd = [sys.executable, osp.abspath(__file__), '_peak', json.dumps(spec), '--threads', str(threads)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith('{'):
            return json.loads(line)
    tail = (proc.stderr.strip().splitlines() or ['no output'])[-1]
    return {'error': tail[:120]}


# --------------------------------------------------------------------------------------------------
# attention core
# --------------------------------------------------------------------------------------------------


def attention_inputs(case, device, seed, kind='pola', dtype=torch.float32):
    """Inputs of one attention case: the op's example inputs (near the trained regime, in the op's own
    layout) for the case's grid in ``dtype``, and the gradient of its output."""
    batch, heads, grid, dim = ATTENTION_CASES[case]
    op = attention_ops()[kind]
    g = torch.Generator().manual_seed(seed)
    tensors, options = op.example_inputs(batch, heads, grid, dim, g)
    with torch.no_grad():
        shape = op.resolve('auto')(*tensors, *options).shape
    grad_out = torch.randn(shape, generator=g)
    leaves = [t.to(device, dtype).requires_grad_() for t in tensors]
    options = [o.to(device) if torch.is_tensor(o) else o for o in options]
    return leaves, options, grad_out.to(device, dtype)


def attention_error(kind, impl_arg, leaves, options, grad_out):
    """Largest error of the output and of every input gradient against the reference in float64 on
    the same inputs, relative to each tensor's largest magnitude."""
    core = attention_core(kind, options)

    def run(tensors, impl, grad):
        tensors = [t.detach().clone().requires_grad_() for t in tensors]
        out = core(*tensors, impl=impl)
        out.backward(grad.to(out.dtype))
        return [out.detach()] + [t.grad for t in tensors]

    truth = run([t.double() for t in leaves], 'reference', grad_out.double())
    actual = run(leaves, impl_arg, grad_out)
    errors = [((a.double() - e).abs().max() / e.abs().max().clamp_min(1e-30)).item() for a, e in zip(actual, truth)]
    return errors[0], max(errors[1:])


def attention_core(kind, options):
    """``fn(*leaves, impl=...)`` of an op with its other arguments (``options``)."""
    from mmpola.ops.dispatch import run_attention_op
    return lambda *leaves, impl: run_attention_op(kind, impl, True, leaves, *options)


def attention_passes(leaves, options, grad_out, impl_arg, kind):
    """(forward without grad, forward + backward) closures of the core."""
    core = attention_core(kind, options)

    def forward():
        with torch.no_grad():
            core(*leaves, impl=impl_arg)

    def forward_backward():
        for t in leaves:
            t.grad = None
        core(*leaves, impl=impl_arg).backward(grad_out)

    def clear():
        for t in leaves:
            t.grad = None

    return forward, forward_backward, clear


def attention_peak_child(spec, device):
    kind = spec.get('attn', 'pola')
    leaves, options, grad_out = attention_inputs(spec['case'], device, spec['seed'], kind,
                                                 getattr(torch, spec.get('dtype', 'float32')))
    with core_impl(kind, spec['impl']) as impl_arg:
        forward, forward_backward, clear = attention_passes(leaves, options, grad_out, impl_arg, kind)
        forward()  # warm-up (and compile) before measuring
        forward_backward()
        clear()
        result = {'fwd': peak_memory_mib(forward, device)}
        result['fwd+bwd'] = peak_memory_mib(forward_backward, device)
    return result


def runnable_impls(kind, wanted, device, dtype):
    """``(impls, skipped)``: the implementations of ``wanted`` that op ``kind`` has and that run on
    ``device`` (with their fp32 island: float32 compute), and ``'impl: reason'`` for those that do not."""
    op = attention_ops()[kind]
    impls, skipped = [], []
    for impl in wanted:
        if impl not in attention_impls(kind):
            continue
        name = 'fast' if impl == COMPILE else op.choose(impl)
        reason = op.unsupported(name, device, torch.float32)
        if reason is None:
            impls.append(impl)
        else:
            skipped.append(f'{kind} {impl}: {reason}')
    return impls, skipped


def bench_attention(args, device):
    rows, skipped = [], []
    dtype = getattr(torch, args.dtype)
    for kind in args.kinds:
        wanted = args.impls or ['reference'] + [i for i in attention_impls(kind) if i not in ('auto', 'reference')]
        impls, cant = runnable_impls(kind, wanted, device, dtype)
        skipped += cant
        for case in args.cases:
            if impls:
                rows += bench_attention_case(args, device, kind, case, impls, skipped)
    print_attention_table(rows, args.impls)
    for line in skipped:
        print(f'skipped {line}')


def bench_attention_case(args, device, kind, case, impls, skipped):
    """The rows of one case; an implementation that turns the case down (its head dim on this GPU) is
    left out, with its reason added to ``skipped``."""
    from mmpola.ops.dispatch import AttnImplUnavailable
    rows = []
    batch, heads, (height, width), dim = ATTENTION_CASES[case]
    leaves, options, grad_out = attention_inputs(case, device, args.seed, kind, getattr(torch, args.dtype))
    first_call, errors = {}, {}
    for impl in impls:  # warm-up: compiles where the impl compiles
        with core_impl(kind, impl) as impl_arg:
            forward, forward_backward, clear = attention_passes(leaves, options, grad_out, impl_arg, kind)
            try:
                first_call[impl] = time_once(forward_backward, device)
            except AttnImplUnavailable as declined:
                skipped.append(f'{kind} {impl} at {case}: {declined}')
                clear()
                continue
            forward()
            clear()
            errors[impl] = attention_error(kind, impl_arg, leaves, options, grad_out) if args.error else None
    impls = list(first_call)
    if not impls:
        return rows
    times = {impl: {'fwd': [], 'fwd+bwd': []} for impl in impls}
    # small cases are fast and noisy: repeat them until ~1 s per impl (at most 20 times)
    repeat = max(args.repeat, min(20, int(1.0 / max(min(first_call.values()), 1e-3))))
    for _ in range(repeat):
        for impl in impls:
            with core_impl(kind, impl) as impl_arg:
                forward, forward_backward, clear = attention_passes(leaves, options, grad_out, impl_arg, kind)
                times[impl]['fwd'].append(time_once(forward, device))
                times[impl]['fwd+bwd'].append(time_once(forward_backward, device))
                clear()
    del leaves, grad_out
    gc.collect()
    for impl in impls:
        memory = {}
        if args.memory:
            spec = dict(kind='attention', attn=kind, case=case, impl=impl, seed=args.seed, device=str(device),
                        dtype=args.dtype)
            if device.type == 'cuda':
                memory = attention_peak_child(spec, device)
            else:
                memory = run_peak_subprocess(spec, torch.get_num_threads())
        rows.append(dict(attn=kind, case=case, tokens=f'{height}x{width}', shape=f'{batch},{heads},{dim}', impl=impl,
                         fwd=min(times[impl]['fwd']), train=min(times[impl]['fwd+bwd']),
                         fwd_median=median(times[impl]['fwd']), train_median=median(times[impl]['fwd+bwd']),
                         repeat=repeat, first=first_call[impl], memory=memory, error=errors[impl]))
    return rows


def print_attention_table(rows, impls):
    base = {(r['attn'], r['case']): r for r in rows if r['impl'] == 'reference'}

    def ratio(row, key, sub=None):
        ref = base.get((row['attn'], row['case']))
        if ref is None or row['impl'] == 'reference':
            return ''
        mine, theirs = (row[key], ref[key]) if sub is None else (row[key].get(sub), ref[key].get(sub))
        if not mine or not theirs:
            return ''
        return f'{theirs / mine:.2f}x' if sub is None else f'{mine / theirs:.2f}x'

    def mem(row, sub):
        value = row['memory'].get(sub)
        if value is None:
            return row['memory'].get('error', '-') if sub == 'fwd+bwd' else '-'
        return f'{value:.0f}'

    def err(row):
        return '-' if row['error'] is None else f"{row['error'][0]:.1e} / {row['error'][1]:.1e}"

    print('\n| attention | case | tokens | B,h,d | impl | fwd ms (min / med) | fwd speed-up | fwd+bwd ms (min / med) | '
          'fwd+bwd speed-up | fwd MiB | fwd+bwd MiB | fwd+bwd mem vs ref | error out / grads | runs | 1st call s |')
    print('|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|')
    for r in rows:
        print(f"| {r['attn']} | {r['case']} | {r['tokens']} | {r['shape']} | {r['impl']} | "
              f"{1e3 * r['fwd']:.2f} / {1e3 * r['fwd_median']:.2f} | {ratio(r, 'fwd')} | "
              f"{1e3 * r['train']:.2f} / {1e3 * r['train_median']:.2f} | {ratio(r, 'train')} | {mem(r, 'fwd')} | "
              f"{mem(r, 'fwd+bwd')} | {ratio(r, 'memory', 'fwd+bwd')} | {err(r)} | {r['repeat']} | "
              f"{r['first']:.1f} |")
    print('\nfwd: forward under no_grad; fwd+bwd: forward and backward to every input (q, k, v and the '
          'logits: Pola power and scale, FLatten scale, PaCS s_same and s_opp). '
          'B,h,d: batch, heads, head dim (C = h * d). '
          'Times: min and median over the runs (impls interleaved); speed-up = reference min / min. '
          'Memory ratio = peak / reference peak. 1st call: first fwd+bwd in the process (includes '
          'torch.compile for compiled rows, kernel compilation for triton rows). Error: largest |difference| '
          'relative to the largest magnitude, against the reference in float64 on the same inputs, of the '
          'output / of the worst input gradient (--no-error skips it).')


# --------------------------------------------------------------------------------------------------
# backbones
# --------------------------------------------------------------------------------------------------


def build_named_backbone(name, attn_impl=None):
    """Build a backbone of :func:`all_backbones` in eval mode; raises RuntimeError when it is not available."""
    from get_flops import build_backbone
    type_name, kwargs = all_backbones()[name]
    try:
        if type_name.startswith('timm:'):
            import timm
            model = timm.create_model(type_name[5:], pretrained=False, features_only=True, **kwargs)
        else:
            model = build_backbone(type_name, **kwargs)
    except (ImportError, KeyError, RuntimeError, TypeError) as err:
        raise RuntimeError(str(err).splitlines()[0][:160]) from err
    if attn_impl is not None and hasattr(model, 'set_attn_impl'):  # mmpola's backbones
        model.set_attn_impl(attn_impl)
    model.eval()  # not chained: mmdet's SwinTransformer.train() returns None
    return model


PASS_RANGES = ('forward', 'backward')  # the profiler's ranges of a backbone pass (backbone_pass(ranges=True))


def backbone_pass(model, image, backward=False, amp=None, ranges=False):
    """The timed pass of a backbone: forward under no_grad, or forward and backward of the sum of the
    outputs' means (train mode); ``amp``: the autocast dtype name, or None. The backward's gradients are set to
    None before each pass as an optimizer wrapper does (over its list of parameters, not by a traversal of the
    modules: ``model.zero_grad`` makes more Python calls than some backbones' forward). ``ranges``: the forward
    and the backward each in a profiler range (:data:`PASS_RANGES`)."""
    device_type = image.device.type
    autocast = torch.autocast(device_type, dtype=getattr(torch, amp)) if amp else contextlib.nullcontext()
    params = list(model.parameters())

    def forward():
        with torch.no_grad(), autocast:
            model(image)

    def forward_backward():
        for param in params:
            param.grad = None
        with autocast:
            outs = model(image)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        sum(o.float().mean() for o in outs).backward()

    if ranges:  # the same passes in the ranges (apart: the timed passes make no more Python calls)
        record = torch.profiler.record_function

        def forward():
            with record(PASS_RANGES[0]), torch.no_grad(), autocast:
                model(image)

        def forward_backward():
            for param in params:
                param.grad = None
            with record(PASS_RANGES[0]), autocast:
                outs = model(image)
            outs = outs if isinstance(outs, (list, tuple)) else [outs]
            with record(PASS_RANGES[1]):
                sum(o.float().mean() for o in outs).backward()

    return forward_backward if backward else forward


def profile_backbone_pass(model, image, args, device, name):
    """One more pass of ``model`` on ``image`` (as 'backbone' times it) under torch.profiler, written to
    ``args.profile`` as 'train --profile' writes an iteration's (chrome trace; summary as Markdown, also returned,
    and JSON: device time, kernels, syncs, the top ops, kernels and host costs, the forward and the backward)."""
    from benchmark_train import IterationProfiler, error_line, write_profile
    step = backbone_pass(model, image, args.backward, args.amp, ranges=True)
    pass_name = 'fwd+bwd' if args.backward else 'fwd'
    height, width = image.shape[-2:]
    stem = f"{name}_{height}x{width}_b{args.batch}_{pass_name.replace('+', '_')}_{args.amp or 'float32'}"
    title = f"{name}, {device.type}, autocast {args.amp or 'off'}, batch {args.batch}, input {height}x{width}"
    profiler = IterationProfiler(device)
    try:
        step()  # the ranges' first use outside the profile
        profiler.start([], PASS_RANGES if args.backward else PASS_RANGES[:1])
        try:
            seconds, _ = time_pass(step, device)
        finally:
            profiler.stop()
    except RuntimeError as err:  # e.g. out of memory, a profiler already running: the timed row stands
        return f'{title}: no profile ({error_line(err)})'
    return write_profile(
        profiler, seconds, device, stem, args.profile, title, what=f'backbone pass ({pass_name})',
        parts_note='forward: the backbone\'s forward (under autocast where asked); backward: the backward of the '
        'sum of its outputs\' means (on CUDA its kernels are launched from autograd\'s thread).',
        rest='rest (setting the gradients to None, the loss)', loaded=' (with the profiler\'s overhead)')


def backbone_peak_child(spec, device):
    model = build_named_backbone(spec['model'], spec.get('attn_impl')).to(device)
    if spec.get('backward'):
        model.train()
    height, width = spec['size']
    image = torch.randn(spec.get('batch', 1), 3, height, width, device=device)
    fn = backbone_pass(model, image, spec.get('backward', False), spec.get('amp'))
    fn()  # warm-up (and compile)
    return {'fwd': peak_memory_mib(fn, device)}


def matmul_gflops(device, size=2048, repeat=3):
    """Measured fp32 GEMM rate (GFLOP/s) at the current thread count: the machine's practical peak."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    a @ b
    seconds = median([time_once(lambda: a @ b, device) for _ in range(repeat)])
    return 2 * size**3 / seconds / 1e9


def bench_backbone(args, device):
    from get_flops import count_flops, count_parameters
    gemm = matmul_gflops(device)
    print(f'\nmeasured fp32 matmul (2048^3): {gemm:.1f} GFLOP/s')
    attn_impl = None if args.attn_impl == 'default' else args.attn_impl
    rows, skipped = [], []
    names = [n for n in all_backbones() if n not in REFERENCE_BACKBONES] if 'all' in args.models \
        else args.models
    for name in names:
        try:
            model = build_named_backbone(name, attn_impl).to(device)
        except RuntimeError as err:
            skipped.append(f'{name}: {err}')
            continue
        params = count_parameters(model)
        if args.backward:
            model.train()
        base_rate = None
        for size_text in args.sizes:
            height, width = parse_size(size_text)
            image = torch.randn(args.batch, 3, height, width, device=device)
            forward = backbone_pass(model, image, args.backward, args.amp)
            try:
                first = time_once(forward, device)
                # fast inputs are noisy on a shared machine: repeat them until ~2 s (at most 10 times)
                repeat = max(args.repeat, min(10, int(2.0 / max(first, 1e-3))))
                seconds, host = min(time_pass(forward, device) for _ in range(repeat))
                flops = (3 if args.backward else 1) * count_flops(model, image, depth=1)[0]
                fresh = [time_once(backbone_pass(model, torch.randn(args.batch, 3, h, w, device=device), args.backward,
                                                 args.amp), device)
                         for _, h, w in new_shapes(args.batch, height, width, args.new_sizes, step=32)]
            except (RuntimeError, AssertionError, ValueError) as err:  # e.g. out of memory
                rows.append(dict(model=name, size=f'{height}x{width}', error=str(err).splitlines()[0][:100]))
                continue
            megapixels = args.batch * height * width / 1e6
            rate = seconds / megapixels
            base_rate = base_rate or rate
            memory = {}
            if args.memory:
                spec = dict(kind='backbone', model=name, size=[height, width], attn_impl=attn_impl,
                            seed=args.seed, device=str(device), batch=args.batch, backward=args.backward,
                            amp=args.amp)
                memory = backbone_peak_child(spec, device) if device.type == 'cuda' else \
                    run_peak_subprocess(spec, torch.get_num_threads())
            profile = profile_backbone_pass(model, image, args, device, name) if args.profile else None
            rows.append(dict(model=name, size=f'{height}x{width}', params=params, gmacs=flops / 2e9,
                             ms=1e3 * seconds, host_ms=1e3 * host, runs=repeat, ms_per_mpx=1e3 * rate,
                             scaling=rate / base_rate,
                             gflops=flops / seconds / 1e9, memory=memory,
                             fresh=1e3 * median(fresh) if fresh else None))
            # at once, so that a run stopped before the table keeps the rows it finished
            peak = memory.get('fwd')
            print(f"{name} {height}x{width}: {1e3 * seconds:.1f} ms {'fwd+bwd' if args.backward else 'fwd'}"
                  + (f' (host {1e3 * host:.1f} ms)' if device.type == 'cuda' else '')
                  + (f', peak {peak:.0f} MiB' if peak is not None else ''), flush=True)
            if profile is not None:  # at once, as the row
                print('\n' + profile, flush=True)
        model = None  # free it before the next backbone
        gc.collect()
    print_backbone_table(args, rows, gemm, host=device.type == 'cuda')
    if args.profile and rows:
        print(f'\nprofiles (printed after each row\'s line above) written to {args.profile}')
    for line in skipped:
        print(f'skipped {line}')


def print_backbone_table(args, rows, gemm, host):
    """The table of ``backbone``'s rows; ``host``: with the host's time of each pass (on a GPU)."""
    from mmpola.ops import depthwise_conv_impl
    pass_name = 'fwd+bwd' if args.backward else 'fwd'
    fresh_head, fresh_rule = (f' {pass_name} ms, new sizes |', '---:|') if args.new_sizes else ('', '')
    host_head, host_rule = (' host ms |', '---:|') if host else ('', '')
    print(f'\n| model | input | params M | GMACs | {pass_name} ms |{host_head} runs | ms / Mpx | '
          f'time/px vs first size | peak MiB | GFLOP/s | % of matmul |{fresh_head}')
    print(f'|---|---|---:|---:|---:|{host_rule}---:|---:|---:|---:|---:|---:|{fresh_rule}')
    for r in rows:
        if 'error' in r:
            print(f"| {r['model']} | {r['size']} | failed: {r['error']} ||||||||| ")
            continue
        peak = r['memory'].get('fwd')
        peak = f'{peak:.0f}' if peak is not None else r['memory'].get('error', '-')
        fresh = f" {r['fresh']:.1f} |" if args.new_sizes else ''
        host_cell = f" {r['host_ms']:.1f} |" if host else ''
        print(f"| {r['model']} | {r['size']} | {r['params'] / 1e6:.2f} | {r['gmacs']:.2f} | {r['ms']:.1f} |{host_cell} "
              f"{r['runs']} | {r['ms_per_mpx']:.1f} | {r['scaling']:.2f} | {peak} | {r['gflops']:.1f} | "
              f"{100 * r['gflops'] / gemm:.0f}% |{fresh}")
    mode = ('fwd+bwd: train mode, backward of the sum of the outputs\' means' if args.backward
            else 'fwd: no_grad, eval mode')
    print(f'\n{mode}; batch {args.batch}; autocast: {args.amp or "off (float32)"}; min over the runs. GMACs: '
          'torch.utils.flop_counter of one forward of the batch (matmul/linear/conv/sdpa; 1 MAC = 2 FLOPs; '
          'fwd+bwd counts 3x). ' + ('host ms: of the same run, the time until the pass returned, before the device '
          'was synchronised (the Python code and the kernels it queued; close to the pass\'s time where the host, '
          'not the device, sets the pace). ' if host else '') +
          'time/px vs first size: 1.00 = time grows linearly with pixels. % of matmul: '
          f'achieved FLOP rate / measured fp32 GEMM rate. Attention implementation: {args.attn_impl}; depthwise '
          f'convolutions: {depthwise_conv_impl()} (MMPOLA_DEPTHWISE_CONV).' +
          (f' New sizes: the median of one pass at each of {args.new_sizes} input sizes not seen before (H and W '
           'smaller by multiples of 32), as a detector\'s changing image sizes bring them: per-shape setup work '
           'shows as the difference to the fixed-size time.' if args.new_sizes else ''))


def bench_scaling(args, device):
    """Forward time at two sizes, interleaved (small, large, small, large, ...) so that load hits both."""
    (h0, w0), (h1, w1) = (parse_size(s) for s in args.sizes)
    pixel_ratio = h1 * w1 / (h0 * w0)
    print(f'\n| model | {h0}x{w0} fwd s (min) | {h1}x{w1} fwd s (min) | pixels x | time x | runs |')
    print('|---|---:|---:|---:|---:|---:|')
    results = []
    for name in args.models:
        model = build_named_backbone(name).to(device)
        images = [torch.randn(1, 3, h, w, device=device) for h, w in ((h0, w0), (h1, w1))]
        times = [[], []]
        with torch.no_grad():
            for image in images:  # warm-up (and compile) at both sizes
                model(image)
            for _ in range(args.repeat):
                for i, image in enumerate(images):
                    times[i].append(time_once(lambda: model(image), device))
        small, large = min(times[0]), min(times[1])
        results.append((name, large / small))
        print(f'| {name} | {small:.3f} | {large:.3f} | {pixel_ratio:.2f} | {large / small:.2f} | {args.repeat} |')
        model = images = None  # free them before the next backbone
        gc.collect()
    print('\nbatch 1, no_grad, eval mode; min over the runs. Linear growth = time x equal to pixels x. '
          'Target: Pola-PVT-T 800x1333 -> 1600x2666 time x <= 4.5.')


def _launches_recorded(attn_impl, device):
    """A context yielding the list of the Triton kernels launched inside: on the CPU with ``--attn-impl
    triton``, a dry run for an H100 (mmpola.ops.triton_support.dry_run: the launch code runs as there and
    records each launch instead of running it, so the aten operators counted are those around the kernels,
    not the interpreter's); elsewhere an empty list (launches on a GPU are not counted apart)."""
    if attn_impl != 'triton' or device.type != 'cpu':
        return contextlib.nullcontext([])
    return h100_dry_run()


def bench_ops(args, device):
    """Operators dispatched by one training-mode forward and its backward of each backbone (eager: a
    torch.compile kernel is one opaque call, so the fast path's compilation is off here), and the bytes
    its forward saves for the backward; with --roofline, the roofline bound of each pass on that GPU
    (benchmark_roofline)."""
    os.environ['MMPOLA_NO_COMPILE'] = '1'
    height, width = parse_size(args.size)
    amp_dtype = getattr(torch, args.amp) if args.amp else None
    peaks = None
    if args.roofline:
        if device.type != 'cpu':
            raise SystemExit('--roofline is an estimate made on the CPU (a dry run records the Triton kernels '
                             'there); run it with --device cpu, and time the passes on a GPU with `backbone`')
        from benchmark_roofline import GPUS, Roofline
        peaks = GPUS[args.roofline]

    def autocast():  # with CUDA's op lists on the CPU: a GPU's casts counted
        return gpu_autocast(device.type, amp_dtype)

    def roofline():
        return Roofline(peaks, args.by_source) if peaks else None

    def bound_cells(estimate, launches):
        """The table cells of a pass's roofline estimate, its Triton ``launches`` added (none without
        --roofline)."""
        if estimate is None:
            return ''
        estimate.add_launches(launches)
        _, flops, nbytes, seconds = estimate.totals()
        return f' {flops / 1e9:.1f} | {nbytes / 1e9:.2f} | {seconds * 1e3:.2f} |'

    extra = ' fwd GFLOP | fwd GB | fwd bound ms | bwd GFLOP | bwd GB | bwd bound ms |' if peaks else ''
    print('\n| model | input | batch | fwd ops | fwd kernels | bwd ops | bwd kernels | syncs | saved MiB |' + extra)
    print('|---|---|---:|---:|---:|---:|---:|---:|---:|' + '---:|' * (6 if peaks else 0))
    attn_impl = None if args.attn_impl == 'default' else args.attn_impl
    tops = []
    for name in args.models:
        model = build_named_backbone(name, attn_impl).to(device)
        model.train()
        image = torch.randn(args.batch, 3, height, width, device=device)
        model.eval()  # not chained: mmdet's SwinTransformer.train() returns None
        with torch.no_grad(), _launches_recorded(attn_impl, device), autocast():
            model(image)  # warm-up outside the count (caches of the map size and dtype)
        if args.inference:
            fwd_bound = roofline()
            with torch.no_grad(), _launches_recorded(attn_impl, device) as launches, autocast():
                fwd = count_dispatched_ops(lambda: model(image), fwd_bound)
            triton = f' (+{len(launches)} Triton)' if attn_impl == 'triton' else ''
            cells = bound_cells(fwd_bound, launches) + (' - | - | - |' if peaks else '')
            print(f'| {name} | {height}x{width} | {args.batch} | {fwd[0]} | {fwd[1]}{triton} | - | - | {fwd[2]} | - |'
                  + cells)
            tops.append((name, [('fwd', fwd_bound)]))
            model = image = None
            gc.collect()
            continue
        model.train()
        outs = []

        def forward():
            result = model(image)
            outs.append(result if isinstance(result, (list, tuple)) else [result])

        fwd_bound, bwd_bound = roofline(), roofline()
        # --by-source: autograd's anomaly mode keeps each node's forward stack, which names the backward's sources
        with _launches_recorded(attn_impl, device) as launches, autocast(), torch.autograd.set_detect_anomaly(
                bool(peaks and args.by_source), check_nan=False):
            fwd = count_dispatched_ops(forward, fwd_bound)
        fwd_launches, cells = len(launches), bound_cells(fwd_bound, launches)
        loss = sum(o.float().mean() for o in outs[0])
        with _launches_recorded(attn_impl, device) as launches:
            bwd = count_dispatched_ops(loss.backward, bwd_bound)
        cells += bound_cells(bwd_bound, launches)
        triton = (f' (+{fwd_launches} Triton)', f' (+{len(launches)} Triton)') if attn_impl == 'triton' else ('', '')
        outs = loss = None
        # a forward of its own: saved-tensor hooks add operators to the backward
        with _launches_recorded(attn_impl, device), autocast():
            _, saved = saved_for_backward(lambda: model(image))
            saved = sum(saved.values())
        print(f'| {name} | {height}x{width} | {args.batch} | {fwd[0]} | {fwd[1]}{triton[0]} | {bwd[0]} | '
              f'{bwd[1]}{triton[1]} | {fwd[2] + bwd[2]} | {saved / 2**20:.1f} |' + cells)
        tops.append((name, [('fwd', fwd_bound), ('bwd', bwd_bound)]))
        model = image = None
        gc.collect()
    mode = ('in eval mode without autograd (inference: the forward only)' if args.inference else 'in train mode')
    print(f'\nCounted at the dispatcher (every aten operator, nested ones included) {mode}; kernels: '
          'operators that are neither views nor launch-free (' + ', '.join(LAUNCH_FREE_OPS) + '); bwd: the '
          'backward of the sum of the outputs\' means (from that sum on); syncs: operators that read a device '
          'value on the host (' + ', '.join(SYNC_OPS) + '); saved MiB: the distinct storages autograd saves '
          'for the backward during the forward (the activation memory a training step holds between them, '
          'whatever the device; the outputs not counted unless saved). Eager '
          f'(no torch.compile). Autocast: {args.amp or "off"}' + (
              " (on the CPU with CUDA's autocast op lists: tools/benchmark_host.py, CudaAutocastLists)"
              if args.amp and device.type == 'cpu' else '')
          + f'. Attention implementation: {args.attn_impl}' + (
              '; on the CPU the Triton kernels are launched as on an H100 and counted apart (+N Triton), '
              'not run' if attn_impl == 'triton' and device.type == 'cpu' else '') + '.')
    if peaks:
        print_roofline(peaks, tops, args.top, args.by_source)


def bench_host(args, device):
    """The host's time of a training step (``--forward``: an inference forward) of each backbone, its compute taken
    out (tools/benchmark_host.py): a narrowed layout's step on the CPU (min and median of ``args.repeat`` after a
    warm-up, the rows in turn), its Python calls, dispatched operators, the kernels among them and Triton launches,
    and the time of those launches from mmpola's launch call down to the launcher
    (:func:`benchmark_host.triton_launch_seconds`)."""
    from benchmark_train import variant_set, variants

    from mmpola.ops.triton_support import interpreting
    if device.type != 'cpu':
        raise SystemExit("host measures the host's share on the CPU; on a GPU, `backbone --device cuda --backward` "
                         'prints the host time of each pass beside its time')
    height, width = parse_size(args.size)
    specs = all_backbones()
    rows = [(name, None) for name in args.models]
    # mmpola's backbones once more per --also-with (--compare-recompute: with the recomputing linear layers, last)
    asked = list(args.also_with) + (['MMPOLA_RECOMPUTE=triton'] if args.compare_recompute else [])
    rows += [(name, variant) for variant in variants(argparse.Namespace(also_with=asked))[1:] for name in args.models
             if not specs[name][0].startswith(('mmdet.', 'timm:'))]
    steps = {}
    for row in rows:
        model = build_narrowed(*specs[row[0]])
        model.train(not args.forward)  # mmdet's Swin returns None from train()
        steps[row] = backbone_pass(model, torch.randn(args.batch, 3, height, width), backward=not args.forward,
                                   amp=args.amp)
    times = {row: [] for row in rows}
    triton_path = not interpreting()  # the interpreter's kernels would run, not launch
    print('\n| model | input | batch | host ms | median ms | Python calls | ops | kernels | Triton launches | '
          "Triton's launch path ms |")
    print('|---|---|---:|---:|---:|---:|---:|---:|---:|---:|')
    with h100_dry_run() as launches, denormals_flushed():
        for row, step in steps.items():
            with variant_set(row[1]):
                for _ in range(args.warmup):
                    step()
                    del launches[:]
        for _ in range(args.repeat):  # in turn: a slower moment of the machine falls on every row alike
            for row, step in steps.items():
                with variant_set(row[1]):
                    start = time.perf_counter()
                    step()
                    times[row].append(time.perf_counter() - start)
                del launches[:]  # a GPU keeps no record of its launches (nor their tensors, for the collector to walk)
        for row, step in steps.items():
            with variant_set(row[1]):
                calls, ops, kernels, launched, _ = step_counts(step, launches)
                # the step's launches, made once more down mmpola's and Triton's launch paths to a stand-in driver
                triton_ms = (f'{1e3 * triton_launch_seconds(list(launches), args.repeat):.2f}' if triton_path
                             else '-')
            del launches[:]
            name = row[0] + ('' if row[1] is None else f', {row[1][0]}={row[1][1]}')
            print(f'| {name} | {height}x{width} | {args.batch} | {1e3 * min(times[row]):.2f} | '
                  f'{1e3 * statistics.median(times[row]):.2f} | {calls} | {ops} | {kernels} | {launched} | '
                  f'{triton_ms} |')
    what = ('One inference forward (eval mode, without autograd: what evaluation and inference run)' if args.forward
            else 'One training step (forward and backward of the sum of the outputs\' means, train mode)')
    print(f'\n{what} of each backbone\'s layout narrowed to {HEAD_DIM} channels per head, on one CPU thread, autocast '
          f'{args.amp or "off"}, denormals flushed to zero; mmpola\'s backbones in a dry run for an H100 (their '
          f'Triton launches recorded, not made; counted under Triton launches). host ms: the fastest of {args.repeat} '
          f'steps after {args.warmup} (the rows\' steps in turn); Python calls: functions entered (sys.setprofile); '
          'ops: aten operators dispatched; kernels: those of them that launch work on a GPU (neither views nor bare '
          "allocations), both counted with CUDA's autocast op lists (tools/benchmark_host.py). The time is what "
          'the host spends on the step where the device does the '
          "work (tools/benchmark_host.py). Triton's launch path ms: the step's Triton launches made once more, from "
          "mmpola's launch call (its direct launch of a launch like one made before, else Triton's own path: its "
          'autotuners, argument binding and specialisation, kernel cache, grid, launch metadata) to a driver that '
          'stands in for an H100\'s and launches nothing (the fastest '
          f'of {args.repeat}): what a GPU\'s host pays for them beside the host ms, but for the launcher\'s C code '
          'and the driver\'s launch calls'
          + ('' if triton_path else '; not measured under Triton\'s interpreter (TRITON_INTERPRET=1), whose '
             'kernels run instead of launching') + '.')


def bench_optim(args, device):
    """The host's time of an optimizer step with the parameter groups that each config's optim_wrapper makes for
    its model, built by mmengine's default constructor and by mmpola's merging one
    (tools/benchmark_train.py: ``narrowed_optimizer``), each stepped by torch's foreach and fused implementations,
    the rows timed in turn."""
    from benchmark_train import OPTIMIZER_IMPLEMENTATIONS, config_label, narrowed_optimizer

    from mmpola.runtime.param_groups import DEFAULT_CONSTRUCTOR, MERGED_CONSTRUCTOR
    if device.type != 'cpu':
        raise SystemExit("optim measures the host's share of the optimizer's step on the CPU; on a GPU, `train "
                         "--profile` times the optimizer step of whole iterations")
    rows = []
    for spec in args.configs:
        for constructor in (DEFAULT_CONSTRUCTOR, MERGED_CONSTRUCTOR):
            for implementation in OPTIMIZER_IMPLEMENTATIONS:
                optimizer, groups, tensors = narrowed_optimizer(spec, constructor, implementation, args.full_size)
                rows.append(dict(name=f'{config_label(spec)} | {constructor.split(".")[-1]} | {implementation}',
                                 step=optimizer.step, groups=groups, tensors=tensors, times=[]))
    for row in rows:
        for _ in range(args.warmup):
            row['step']()
    for _ in range(args.repeat):  # in turn: a slower moment of the machine falls on every row alike
        for row in rows:
            start = time.perf_counter()
            row['step']()
            row['times'].append(time.perf_counter() - start)
    print('\n| config | constructor | implementation | parameter groups | tensors | step ms | median ms | Python calls '
          '| ops |')
    print('|---|---|---|---:|---:|---:|---:|---:|---:|')
    for row in rows:
        print(f"| {row['name']} | {row['groups']} | {row['tensors']} | {1e3 * min(row['times']):.2f} | "
              f"{1e3 * statistics.median(row['times']):.2f} | {python_calls(row['step'])} | "
              f"{count_dispatched_ops(row['step'])[0]} |")
    tensors_text = ('tensors of the parameters\' shapes with random gradients' if args.full_size else
                    'one-element tensors')
    share = 'the whole step on the CPU' if args.full_size else "the host's share of the step"
    print(f"\nOne optimizer step with each config's parameter groups (those its optim_wrapper makes for its model "
          f"with the constructor named) over {tensors_text}, by torch's implementation named (foreach: torch's "
          f"default on CUDA, which on a GPU also launches each foreach kernel once per group; fused: one operator per "
          f"group), on one CPU thread: {share}. step ms: the fastest of {args.repeat} steps "
          f"after {args.warmup} (the rows in turn); Python calls: functions entered (sys.setprofile); ops: aten "
          f"operators dispatched.")


def print_roofline(peaks, tops, count, by_source=False):
    """What the roofline columns mean, and each pass's ``count`` kinds of kernel with the largest bound (with
    ``by_source``, each kind per source)."""
    print(f'\nRoofline bound on {peaks.name} ({peaks.half_flops / 1e12:.0f} TFLOP/s fp16/bf16 dense, '
          f'{peaks.float_flops / 1e12:.1f} fp32, {peaks.bandwidth / 1e12:.2f} TB/s): the sum over the counted kernels '
          'of the larger of FLOPs / peak rate and bytes / bandwidth (tools/benchmark_roofline.py: FLOPs by '
          "torch's flop counter; Triton kernels by their bytes only); a lower bound of the device time, not a "
          'measurement.')
    if not count:
        return
    if by_source:
        print("\nkernel: the operator @ where it comes from, the line of the models' code that dispatched it in the "
              'forward, the autograd node that ran it in the backward (tools/benchmark_roofline.py, '
              'operator_source).')
    print('\n| model | pass | kernel | kernels | GFLOP | GB | bound ms | share |')
    print('|---|---|---|---:|---:|---:|---:|---:|')
    for name, passes in tops:
        for label, estimate in passes:
            total = estimate.totals()[3] or 1.0
            for kind, kernels, flops, nbytes, seconds in estimate.top(count):
                print(f'| {name} | {label} | {kind} | {kernels} | {flops / 1e9:.1f} | {nbytes / 1e9:.3f} | '
                      f'{seconds * 1e3:.3f} | {seconds / total:.0%} |')


def _finite_report(model, image, dtype, device):
    """Autocast forward+backward; returns (seconds, outputs finite, all grads finite, max |out|, #grads)."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    with torch.autocast(device_type=device.type, dtype=dtype):
        outs = model(image)
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    loss = sum(o.float().pow(2).mean() for o in outs)
    loss.backward()
    synchronize(device)
    seconds = time.perf_counter() - start
    out_finite = all(bool(torch.isfinite(o).all()) for o in outs)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    grad_finite = all(bool(torch.isfinite(g).all()) for g in grads)
    max_abs = max(float(o.detach().float().abs().max()) for o in outs)
    missing = sum(1 for p in model.parameters() if p.requires_grad and p.grad is None)
    return seconds, out_finite, grad_finite, max_abs, len(grads), missing, [o.dtype for o in outs]


def bench_amp(args, device):
    dtypes = args.dtypes or (['float16', 'bfloat16'] if device.type == 'cuda' else ['bfloat16'])
    height, width = parse_size(args.size)
    print('\n| backbone | autocast dtype | input | fwd+bwd s | outputs finite | grads finite | '
          'max abs output | params with grad | output dtypes |')
    print('|---|---|---|---:|---|---|---:|---:|---|')
    failures = []
    for name in args.models:
        type_name, kwargs = all_backbones()[name]
        from get_flops import build_backbone
        model = build_backbone(type_name, **kwargs).to(device)
        model.train()
        image = torch.randn(1, 3, height, width, device=device, generator=None) * 1.5
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            try:
                # first call: warm-up (torch.compile of the Pola core), checked as well
                first = _finite_report(model, image, dtype, device)
                seconds, out_ok, grad_ok, max_abs, n_grads, missing, out_dtypes = \
                    _finite_report(model, image, dtype, device)
                out_ok, grad_ok = out_ok and first[1], grad_ok and first[2]
            except RuntimeError as err:  # e.g. out of memory: reported, the other rows still run
                failures.append(name)
                print(f'| {name} | {dtype_name} | {height}x{width} | failed: {str(err).splitlines()[0][:80]} ||||||')
                continue
            if not (out_ok and grad_ok) or missing:
                failures.append(name)
            kinds = ','.join(sorted({str(d).replace('torch.', '') for d in out_dtypes}))
            print(f'| {name} | {dtype_name} | {height}x{width} | {seconds:.1f} | {out_ok} | {grad_ok} | '
                  f'{max_abs:.3g} | {n_grads} (missing {missing}) | {kinds} |')
        model = image = None  # free them before the next backbone
        gc.collect()
    print('\nbatch 1, train mode, random weights (init as built), input N(0, 1.5^2); loss = mean of squared '
          'outputs in fp32; time of the second call (the first one compiles). Finite = no NaN/inf anywhere in '
          'the 4 stage outputs and in every parameter gradient.')
    print('result: ' + ('all finite' if not failures else 'NOT finite / failed: ' + ', '.join(failures)))


# --------------------------------------------------------------------------------------------------
# layers
# --------------------------------------------------------------------------------------------------


def value_conv_inputs(case, device, dtype, layout, seed, shape=None):
    """The depthwise conv of the attentions' value path (mmpola.models.attention.grid_terms.depthwise_value_heads:
    Pola, FLatten; a mmpola.models.layers.DepthwiseConv2d) for attention case ``case``, and its input in
    ``dtype``: the heads' values in the projection's slot, seen in place as (B, h, d, H, W), what the attentions
    pass (``layout='projection'``: a view of the (B, H*W, 4, h, d) projection, the gradient flowing to it),
    the same values as one channels-last (B * h, d, H, W) map (``'channels_last'``, what they passed before),
    or as a contiguous one (``'contiguous'``); ``shape``: (B * h, H, W) instead of the case's."""
    from mmpola.models.layers import DepthwiseConv2d
    batch, heads, (height, width), dim = ATTENTION_CASES[case]
    images, height, width = shape or (batch * heads, height, width)
    g = torch.Generator().manual_seed(seed)
    conv = DepthwiseConv2d(dim, 5)
    conv = conv.to(device=device, dtype=dtype)
    if layout == 'projection':
        heads = heads if images % heads == 0 else 1
        projection = torch.randn(images // heads, height * width, 4, heads, dim, generator=g).to(device, dtype)
        projection.requires_grad_()
        return conv, projection[:, :, 2].unflatten(1, (height, width)).permute(0, 3, 4, 1, 2)
    v = torch.randn(images, height, width, dim, generator=g).to(device, dtype).permute(0, 3, 1, 2)
    if layout == 'contiguous':
        v = v.contiguous()
    return conv, v.requires_grad_()


def conv_maps(x):
    """(images, C, H, W) of a conv input (B, C, H, W), or (B, G, C, H, W): B * G maps."""
    return (x.shape[0] * x.shape[1], *x.shape[2:]) if x.dim() == 5 else tuple(x.shape)


def new_shapes(images, height, width, count, step=4):
    """``count`` shapes (images, H, W) near the given one and unlike it and each other, as a detector's
    batches bring them: other sizes (H and W smaller by multiples of ``step``), or, for maps of at most 64
    pixels (windows, whose number changes with the image size), other numbers of images."""
    if height * width <= 64:
        return [(images + i, height, width) for i in range(1, count + 1)]
    steps = [(a, b) for a in range(count + 1) for b in range(count + 1) if a or b][:count]
    return [(images, max(step, height - step * a), max(step, width - step * b)) for a, b in steps]


# (implementation of mmpola.ops.depthwise_conv2d, input layout) rows of 'layers'
LAYER_VARIANTS = (('torch', 'projection'), ('torch', 'channels_last'), ('torch', 'contiguous'),
                  ('triton', 'projection'), ('triton', 'channels_last'))
# PVT's spatial reduction of the keys and values (mmpola.models.attention.projections.spatial_reduction: a
# conv of kernel = stride = its ratio on the channels-last view of the tokens), per PVT stage of the cases
SR_RATIOS = {'pvt-s1': 8, 'pvt-s2': 4}
SR_VARIANTS = (('torch', 'channels_last'), ('torch', 'contiguous'))


def sr_conv_inputs(case, device, dtype, layout, seed, shape=None):
    """PVT's spatial-reduction conv (C channels, kernel = stride = the stage's ratio) for attention case
    ``case`` and its input (B, C, H, W): the channels-last view of the (B, H*W, C) tokens that the attention
    passes, or that view made contiguous (mmdet's PVT); ``shape``: (B, H, W) instead of the case's."""
    batch, heads, (height, width), dim = ATTENTION_CASES[case]
    ratio = SR_RATIOS[case.split('@')[0]]
    images, height, width = shape or (batch, height, width)
    g = torch.Generator().manual_seed(seed)
    conv = torch.nn.Conv2d(heads * dim, heads * dim, ratio, ratio).to(device=device, dtype=dtype)
    x = torch.randn(images, height, width, heads * dim, generator=g).to(device, dtype).permute(0, 3, 1, 2)
    if layout == 'contiguous':
        x = x.contiguous()
    return conv, x.requires_grad_()


def layer_passes(run, conv, x, seed):
    """fwd, fwd + weight gradient, fwd + input gradient, fwd + all gradients of ``run()`` (a conv of ``x``
    by ``conv``'s parameters), with an output gradient in the output's layout."""
    with torch.no_grad():
        out = run()
    grad = torch.empty_like(out).copy_(torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1)))

    def forward():
        with torch.no_grad():
            run()

    return dict(fwd=forward, wgrad=lambda: torch.autograd.grad(run(), [conv.weight], grad),
                dgrad=lambda: torch.autograd.grad(run(), [x], grad),
                bwd=lambda: torch.autograd.grad(run(), [conv.weight, conv.bias, x], grad))


def _layer_kinds(case):
    """(row name, variants, inputs(device, dtype, layout, seed, shape), passes(conv, x, impl, seed)) of each
    layer 'layers' times for ``case``: the value path's depthwise conv; PVT's spatial reduction where the
    case is a PVT stage that has one."""
    from mmpola.ops import depthwise_conv2d
    kinds = [('dwconv 5x5', LAYER_VARIANTS, functools.partial(value_conv_inputs, case),
              lambda conv, x, impl, seed: layer_passes(lambda: depthwise_conv2d(x, conv.weight, conv.bias, impl),
                                                       conv, x, seed))]
    ratio = SR_RATIOS.get(case.split('@')[0])
    if ratio:
        kinds.append((f'sr conv {ratio}x{ratio}/{ratio}', SR_VARIANTS, functools.partial(sr_conv_inputs, case),
                      lambda conv, x, impl, seed: layer_passes(lambda: conv(x), conv, x, seed)))
    return kinds


def bench_layers(args, device):
    """fwd, fwd + weight gradient, fwd + input gradient and fwd + both of single convolutions of the
    attentions (the value path's depthwise 5x5 conv; PVT's spatial-reduction conv), per case, dtype,
    implementation and input layout (interleaved within each repetition); then fwd + both at
    ``--new-shapes`` shapes the implementation has not seen, one call each."""
    from mmpola.ops.triton_support import triton_unsupported
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    print(f'- cudnn.benchmark: {torch.backends.cudnn.benchmark}' if device.type == 'cuda' else '- (no cuDNN)')
    print('\n| layer | case | input (N,C,H,W) | dtype | impl | input layout | fwd ms | fwd+wgrad ms | fwd+dgrad ms | '
          'fwd+bwd ms | runs | fwd+bwd ms, new shapes |')
    print('|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|')
    skipped = set()
    for case in args.cases:
        for layer, variants, make_inputs, make_passes in _layer_kinds(case):
            for dtype_name in args.dtypes:
                dtype = getattr(torch, dtype_name)
                runs = {}
                for impl, layout in variants:
                    reason = triton_unsupported(device, dtype) if impl == 'triton' else None
                    if impl not in args.impls or reason is not None:
                        if reason is not None:
                            skipped.add(f'{impl}: {reason}')
                        continue
                    conv, x = make_inputs(device, dtype, layout, args.seed)
                    passes = make_passes(conv, x, impl, args.seed)
                    for fn in passes.values():  # warm-up (cuDNN picks its kernels, Triton compiles and tunes)
                        fn()
                    runs[impl, layout] = (conv_maps(x), passes, {name: [] for name in passes})
                for _ in range(args.repeat):
                    for _, passes, times in runs.values():
                        for name, fn in passes.items():
                            times[name].append(time_once(fn, device))
                for (impl, layout), (shape, _, times) in runs.items():
                    ms = {name: 1e3 * min(values) for name, values in times.items()}
                    fresh = []
                    for images, height, width in new_shapes(shape[0], shape[2], shape[3], args.new_shapes):
                        conv, x = make_inputs(device, dtype, layout, args.seed, (images, height, width))
                        fresh.append(1e3 * time_once(make_passes(conv, x, impl, args.seed)['bwd'], device))
                    fresh = f'{median(fresh):.2f}' if fresh else '-'
                    print(f"| {layer} | {case} | {','.join(map(str, shape))} | {dtype_name} | {impl} | {layout} | "
                          f"{ms['fwd']:.2f} | {ms['wgrad']:.2f} | {ms['dgrad']:.2f} | {ms['bwd']:.2f} | "
                          f'{args.repeat} | {fresh} |')
                runs = None
                gc.collect()
    print('\ndwconv 5x5: the depthwise conv (d channels, 5x5, groups=d) of the Pola / FLatten value path on the '
          'heads\' values (B * h maps of d channels) of the case, by mmpola.ops.depthwise_conv2d: impl torch = '
          'F.conv2d (cuDNN on CUDA), triton = mmpola\'s Triton kernels (mmpola.models.layers.DepthwiseConv2d); '
          'projection: the values seen in place in their projection, as '
          '(B, h, d, H, W) (what the attentions pass: the Triton kernels read it there, the library convolution '
          'copies it once), channels_last: one channels-last (B * h, d, H, W) map of them. sr conv: PVT\'s '
          'spatial reduction of the keys and values (C channels, kernel = stride = the stage\'s ratio) on the '
          '(B, C, H, W) map of the tokens, by nn.Conv2d: channels_last is the view the attention passes. '
          'contiguous: the same values copied to NCHW (what mmdet\'s PVT passes its spatial reduction). The '
          'input, the weight and the output gradient are in the row\'s dtype (as under autocast). Times: min '
          'over the runs (rows interleaved) of the forward under no_grad, and of the forward with the weight '
          'gradient, with the input gradient, and with all gradients. '
          f'New shapes: the median fwd+bwd of one call at each of {args.new_shapes} shapes not seen before (other '
          'map sizes; other numbers of windows for window-sized maps), as a detector\'s changing image sizes bring '
          'them: what a new shape costs beyond the compute (an implementation\'s per-shape setup) shows as the '
          'difference to fwd+bwd.')
    for line in sorted(skipped):
        print(f'skipped {line}')


# --------------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------------


def kernel_options(parser):
    parser.add_argument('--dwconv-impl', default=None, choices=['auto', 'torch', 'triton'],
                        help="implementation of mmpola's depthwise convolutions (sets MMPOLA_DEPTHWISE_CONV; default: "
                        "the environment's, 'auto' when unset)")
    parser.add_argument('--recompute-impl', default=None, choices=['auto', 'torch', 'triton', 'elementwise'],
                        help="implementation of the linear layers that recompute their input in the backward "
                        "(mmpola's MLPs, gated attentions and the linear layers after a LayerNorm; sets "
                        "MMPOLA_RECOMPUTE; 'auto' and 'torch': the library's layers, autograd keeps it; 'triton': "
                        "the kernels recompute it; 'elementwise': the kernels for the MLPs' GELU, and for the gates "
                        "that the attention's kernels do not multiply, the library's LayerNorms; default: the "
                        "environment's, 'auto' when unset)")
    parser.add_argument('--sdpa-impl', default=None, choices=['auto', 'torch'],
                        help="backends of the softmax kinds' scaled_dot_product_attention (sets MMPOLA_SDPA; 'auto': "
                        "cuDNN's attention left out on CUDA, 'torch': torch's choice; default: the environment's, "
                        "'auto' when unset)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest='command', required=True)

    def common(p):
        p.add_argument('--device', default='cpu', help="'cpu' or 'cuda' (peak memory method differs)")
        p.add_argument('--threads', type=int, default=None, help='torch threads (default: torch default)')
        p.add_argument('--seed', type=int, default=0)
        p.add_argument('--no-memory', dest='memory', action='store_false', help='skip peak-memory runs')
        p.add_argument('--malloc', default='tuned', choices=['tuned', 'default'],
                       help="'tuned': what mmpola's tools do (mmpola.runtime.allocator.tune_malloc); "
                       "'default': glibc's defaults")

    attention = sub.add_parser('attention', help='attention cores (Pola, FLatten, InLine): reference vs fast')
    common(attention)
    attention.add_argument('--kinds', nargs='+', default=sorted(attention_ops()), choices=sorted(attention_ops()))
    attention.add_argument('--cases', nargs='+', default=DEFAULT_ATTENTION_CASES, choices=list(ATTENTION_CASES))
    impls = sorted({i for kind in attention_ops() for i in attention_impls(kind)})
    attention.add_argument('--impls', nargs='+', default=None, choices=impls,
                           help='implementations (default: every one the op has; those an op does not have, or '
                           'that cannot run on the device, are skipped)')
    attention.add_argument('--dtype', default='float32', choices=['float32', 'bfloat16', 'float16'],
                           help="the inputs' dtype (the ops compute in float32: their fp32 island)")
    attention.add_argument('--no-error', dest='error', action='store_false',
                           help='skip the comparison with the float64 reference')
    attention.add_argument('--repeat', type=int, default=3)

    backbone = sub.add_parser('backbone', help='whole backbones: time, memory, FLOP rate vs input size')
    common(backbone)
    backbone.add_argument('--models', nargs='+', default=list(DEFAULT_BACKBONES),
                          choices=list(all_backbones()) + ['all'],
                          help="backbone names, or 'all' (every preset at every size)")
    backbone.add_argument('--sizes', nargs='+', default=list(BACKBONE_SIZES), help='S or HxW')
    backbone.add_argument('--attn-impl', default='default',
                          help="set every attention's implementation (set_attn_impl): 'auto', 'fast', 'reference' or "
                          "another registered one ('default': as built)")
    backbone.add_argument('--repeat', type=int, default=2)
    backbone.add_argument('--batch', type=int, default=1)
    backbone.add_argument('--backward', action='store_true', help='time forward + backward in train mode')
    backbone.add_argument('--amp', default=None, choices=['bfloat16', 'float16'], help='autocast dtype')
    backbone.add_argument('--new-sizes', type=int, default=0,
                          help='also time one pass at each of this many input sizes not seen before (a column)')
    backbone.add_argument('--profile', metavar='DIR', default=None,
                          help="after each row's timed passes, profile one more and write "
                          "DIR/<model>_<size>_..._trace.json (chrome trace) and _profile.md / .json (summary), as "
                          "train's --profile")
    kernel_options(backbone)

    scaling = sub.add_parser('scaling', help='growth of backbone forward time with pixel count')
    common(scaling)
    scaling.add_argument('--models', nargs='+', default=['pola-pvt-t'], choices=list(all_backbones()))
    scaling.add_argument('--sizes', nargs=2, default=['800x1333', '1600x2666'], metavar=('SMALL', 'LARGE'))
    scaling.add_argument('--repeat', type=int, default=3)

    ops = sub.add_parser('ops', help='operators (and kernels, syncs) one training fwd+bwd of a backbone dispatches')
    common(ops)
    ops.add_argument('--models', nargs='+', default=['pola-pvt-t', 'pvt-t', 'pola-swin-t', 'swin-t'],
                     choices=list(all_backbones()))
    ops.add_argument('--size', default='256x384', help='S or HxW')
    ops.add_argument('--batch', type=int, default=2)
    ops.add_argument('--attn-impl', default='default', help="as for 'backbone'")
    ops.add_argument('--amp', default=None, choices=['bfloat16', 'float16'], help='autocast dtype of the forward')
    ops.add_argument('--inference', action='store_true',
                     help='count one eval-mode forward without autograd (inference) instead of a training step')
    from benchmark_roofline import GPUS
    ops.add_argument('--roofline', default=None, choices=sorted(GPUS),
                     help='also print the roofline bound of each pass on this GPU (estimated on the CPU: '
                     'tools/benchmark_roofline.py)')
    ops.add_argument('--top', type=int, default=8,
                     help='with --roofline: list the kinds of kernel with the largest bound, this many per pass '
                     '(0: none)')
    ops.add_argument('--by-source', action='store_true',
                     help="with --roofline: list each kind of operator per source, the line of the models' code that "
                     'dispatched it in the forward, the autograd node that ran it in the backward and the line that '
                     "made that node (autograd's anomaly mode records it) (tools/benchmark_roofline.py)")
    kernel_options(ops)
    ops.add_argument('--repeat', type=int, default=1, help=argparse.SUPPRESS)

    host = sub.add_parser('host', help="the host's time of a training step (or with --forward an inference forward) "
                          'of each backbone, its compute taken out (on the CPU: layouts narrowed, Triton launches '
                          'recorded; tools/benchmark_host.py)')
    common(host)
    host.set_defaults(threads=1, memory=False)  # the host's code runs on one thread; it measures no memory
    host.add_argument('--models', nargs='+', default=list(HOST_BACKBONES), choices=list(HOST_BACKBONES))
    host.add_argument('--size', default='64x96', help='S or HxW')
    host.add_argument('--batch', type=int, default=1)
    host.add_argument('--amp', default=None, choices=['bfloat16', 'float16'], help='autocast dtype of the forward')
    host.add_argument('--forward', action='store_true',
                      help='time the forward alone, in eval mode without autograd (evaluation and inference) '
                      'instead of a training step')
    host.add_argument('--repeat', type=int, default=30)
    host.add_argument('--warmup', type=int, default=5)
    host.add_argument('--also-with', action='append', default=[], metavar='VARIABLE=VALUE',
                      help="also time mmpola's backbones with one of mmpola's implementation variables set "
                      '(repeatable: one more row per backbone and use), in turn with the other rows, e.g. '
                      'MMPOLA_DEPTHWISE_CONV=torch')
    host.add_argument('--compare-recompute', action='store_true',
                      help="--also-with MMPOLA_RECOMPUTE=triton: mmpola's backbones with the linear layers that "
                      'recompute their input')
    kernel_options(host)

    optim = sub.add_parser('optim', help="the host's time of an optimizer step with each config's parameter groups, "
                           "mmengine's default constructor against mmpola's merging one, torch's foreach and fused "
                           "implementations (on the CPU)")
    common(optim)
    optim.set_defaults(threads=1, memory=False)
    optim.add_argument('configs', nargs='+', metavar='CONFIG',
                       help='config files, or configs of the installed task libraries (mmdet::swin/...)')
    optim.add_argument('--repeat', type=int, default=30)
    optim.add_argument('--full-size', action='store_true', help="tensors of the parameters' shapes (the "
                       'whole step on the CPU, its arithmetic included) in place of one-element ones')
    optim.add_argument('--warmup', type=int, default=3)

    amp = sub.add_parser('amp', help='autocast forward+backward of every full-size backbone: finite?')
    common(amp)
    amp.add_argument('--models', nargs='+', default=pola_backbones(), choices=list(all_backbones()))
    amp.add_argument('--size', default='800x1216', help='S or HxW')
    amp.add_argument('--dtypes', nargs='+', default=None, choices=['bfloat16', 'float16'],
                     help='default: bfloat16 on the CPU, float16 and bfloat16 on CUDA')
    amp.add_argument('--repeat', type=int, default=1)

    layers = sub.add_parser('layers', help="single layers of the attentions: the value path's depthwise 5x5 "
                            "conv (library vs Triton) and PVT's spatial-reduction conv, fwd and bwd, channels-last vs "
                            'contiguous input, new shapes')
    common(layers)
    layers.add_argument('--cases', nargs='+', default=['pvt-s1@224', 'swin-s1@224'], choices=list(ATTENTION_CASES),
                        help='attention cases: their batch x heads, head dim and token grid')
    layers.add_argument('--dtypes', nargs='+', default=['float32', 'bfloat16', 'float16'],
                        choices=['float32', 'bfloat16', 'float16'])
    layers.add_argument('--impls', nargs='+', default=['torch', 'triton'], choices=['torch', 'triton'],
                        help="implementations of mmpola.ops.depthwise_conv2d (triton: where its kernels run)")
    layers.add_argument('--new-shapes', type=int, default=5, help='shapes not seen before, one fwd+bwd each')
    layers.add_argument('--cudnn-benchmark', action='store_true', help='torch.backends.cudnn.benchmark = True '
                        "(default False, as mmengine's env_cfg)")
    layers.add_argument('--repeat', type=int, default=5)

    from benchmark_train import HOOK_MODES
    train = sub.add_parser('train', help='training throughput of whole configs (s/iter, images/s, data time, peak '
                           'memory; --profile: one iteration under torch.profiler)')
    train.add_argument('configs', nargs='+', metavar='CONFIG',
                       help='config files, or configs of the installed task libraries '
                       '(mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py)')
    train.add_argument('--cfg-options', nargs='+', default=None, metavar='KEY=VALUE',
                       help="options merged into every config, as tools/train.py's (e.g. mmpola's optimizer "
                       'step for an mmdet config: optim_wrapper.constructor=mmpola.MergedGroupsOptimWrapperConstructor '
                       'optim_wrapper.optimizer.fused=True)')
    train.add_argument('--iters', type=int, default=20, help='timed iterations')
    train.add_argument('--warmup', type=int, default=5, help='iterations before the timed ones (at least 1)')
    train.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    train.add_argument('--amp', action='store_true', help="mixed precision as tools/train.py --amp: mmengine's "
                       'AmpOptimWrapper (fp16) on CUDA, bf16 autocast of the backbone on the CPU')
    train.add_argument('--batch-size', type=int, default=None, help='images per iteration (default: the config\'s)')
    train.add_argument('--data-root', default=None, help="real data: replaces the config's data_root (default: "
                       "generated data in the layout of the config's dataset)")
    train.add_argument('--img-scale', type=int, nargs=2, default=None, metavar=('W', 'H'),
                       help='resize scale of the training pipeline (crops at most H x W; default: the config\'s)')
    train.add_argument('--hooks', default='mmpola', choices=HOOK_MODES,
                       help="the same hooks on every config: 'mmpola' (default): mmpola's runtime hooks added to "
                       "configs without them; 'library': removed from mmpola's configs; 'config': each config's own")
    train.add_argument('--attn-impl', default=None,
                       help="implementation of the attention ops in mmpola's backbones ('auto', 'fast', 'triton', "
                       "'reference'; default: the config's, i.e. 'auto'); other libraries' backbones are unchanged")
    kernel_options(train)
    train.add_argument('--profile', metavar='DIR', default=None,
                       help='after the timed iterations, profile one more and write DIR/<config>_trace.json '
                       '(chrome trace) and DIR/<config>_profile.md / .json (summary)')
    train.add_argument('--also-with', action='append', default=[], metavar='VARIABLE=VALUE',
                       help="also time each config, right after its own row, with one of mmpola's implementation "
                       "variables set (repeatable: one more row per use; MMPOLA_RECOMPUTE, MMPOLA_DEPTHWISE_CONV, "
                       "MMPOLA_SDPA, MMPOLA_TRITON_AUTOTUNE), e.g. MMPOLA_RECOMPUTE=triton: ratios measured side by "
                       "side in one process (--profile profiles the configs' own rows)")
    train.add_argument('--threads', type=int, default=None, help='torch threads (default: torch default)')
    train.add_argument('--seed', type=int, default=0)
    train.add_argument('--malloc', default='tuned', choices=['tuned', 'default'],
                       help="'tuned': what mmpola's tools do (mmpola.runtime.allocator.tune_malloc); "
                       "'default': glibc's defaults")

    memory = sub.add_parser('memory', help='what a training step of whole configs keeps on a GPU (parameters, '
                            'gradients, optimizer state, saved activations by part), counted on the CPU in a dry run '
                            '(tools/benchmark_memory.py)')
    memory.add_argument('configs', nargs='+', metavar='CONFIG', help="as for 'train'")
    memory.add_argument('--pairs', action='store_true',
                        help='the configs two by two, each followed by its counterpart (e.g. a Pola detector and '
                        "mmdet's): ratios of each config's rows to its counterpart's")
    memory.add_argument('--cfg-options', nargs='+', default=None, metavar='KEY=VALUE', help="as for 'train'")
    memory.add_argument('--amp', default='float16', choices=['bfloat16', 'float16'],
                        help="autocast dtype of the forward (default: float16, as tools/train.py --amp on CUDA)")
    memory.add_argument('--batch-size', type=int, default=None, help="images per iteration (default: the config's)")
    memory.add_argument('--img-scale', type=int, nargs=2, default=None, metavar=('W', 'H'),
                        help="resize scale of the training pipeline (default: the config's)")
    memory.add_argument('--also-with', action='append', default=[], metavar='VARIABLE=VALUE',
                        help="also count each config with one of mmpola's implementation variables set (repeatable), "
                        'e.g. MMPOLA_RECOMPUTE=triton')
    memory.add_argument('--device', default='cpu', choices=['cpu'])
    memory.add_argument('--threads', type=int, default=None, help='torch threads (default: torch default)')
    memory.add_argument('--seed', type=int, default=0)
    memory.add_argument('--malloc', default='tuned', choices=['tuned', 'default'], help=argparse.SUPPRESS)
    memory.set_defaults(memory=False, repeat=1)

    peak = sub.add_parser('_peak', help=argparse.SUPPRESS)  # internal: one memory measurement
    peak.add_argument('spec')
    peak.add_argument('--threads', type=int, default=None)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    # kernel_options: the variables the models read at each call, for the whole run (and the _peak children)
    for option, variable in (('dwconv_impl', 'MMPOLA_DEPTHWISE_CONV'), ('recompute_impl', 'MMPOLA_RECOMPUTE'),
                             ('sdpa_impl', 'MMPOLA_SDPA')):
        if getattr(args, option, None):
            os.environ[variable] = getattr(args, option)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.command == '_peak':
        spec = json.loads(args.spec)
        device = torch.device(spec['device'])
        torch.manual_seed(spec['seed'])
        child = attention_peak_child if spec['kind'] == 'attention' else backbone_peak_child
        print(json.dumps(child(spec, device)))
        return
    args.malloc_state = 'off (--malloc default)'
    if args.malloc == 'tuned':
        from mmpola.runtime.allocator import tune_malloc
        args.malloc_state = tune_malloc()
    device = torch.device(args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        from mmpola.runtime.launch import cuda_unusable_message
        raise SystemExit('error: ' + cuda_unusable_message('--device cuda asks for a GPU'))
    if getattr(args, 'memory', False) and device.type == 'cpu' and not cpu_peak_supported():
        print('peak memory needs Linux /proc/self/clear_refs; skipping it (--no-memory)')
        args.memory = False
    torch.manual_seed(args.seed)
    print(f'# benchmark {args.command}')
    for line in environment_lines(args, device):
        print(f'- {line}')
    if args.command == 'train':
        from benchmark_train import bench_train
        bench_train(args, device)
        return
    {'attention': bench_attention, 'backbone': bench_backbone, 'scaling': bench_scaling, 'ops': bench_ops,
     'amp': bench_amp, 'layers': bench_layers, 'host': bench_host,
     'optim': bench_optim, 'memory': bench_memory}[args.command](args, device)


if __name__ == '__main__':
    main()
