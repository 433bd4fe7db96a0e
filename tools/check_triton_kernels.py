#!/usr/bin/env python3
"""Compile every Triton kernel of the attention ops (and of the depthwise convolution and the recomputing linear
layers) for NVIDIA GPUs ahead of time, without a GPU.

    python tools/check_triton_kernels.py                       # every op, head dim, dtype and target
    python tools/check_triton_kernels.py --ops pola flatten --targets sm_90 --head-dims 64 128
    python tools/check_triton_kernels.py --ops inline --kernels _inline_kv_kernel --dtypes bfloat16
    python tools/check_triton_kernels.py --front-end             # Triton's front end only: seconds
    python tools/check_triton_kernels.py --untuned               # only the configs that run without tuning

The kernels and their launch options come from the ops' own launch code: each op's ``'triton'``
implementation runs forward and backward on CPU tensors (the op's example inputs, q, k, v cast to the
dtype, with a key bias of that dtype where the implementation takes one, as the models pass it) inside
:func:`mmpola.ops.triton_support.dry_run`, which makes the launch code choose its blocks, warps,
precisions and chunks as on the target GPU and records the launches instead of making them.
Each recorded launch (with every config of an autotuned kernel) is bound to its arguments as Triton
binds a launch (types, integer and alignment specialisations) and compiled by ``triton.compile``
for the target (ptxas ships with Triton's NVIDIA backend); identical compilations are done once.

The depthwise convolution (``--ops depthwise``) runs its forward and backward the same way, on channels-last
maps of the grids below with as many channels as the head dim, at kernel sizes 3 and 5, at 3 with
kernels of their own per image (InLine's local residual), and at 5 on the heads' values seen in place in
their projection (the Pola and FLatten value term), there also as the joined value term runs it with Pola's
gate (the gated output, the gate's gradients in the weight gradient's kernel, the input gradient added to
the values' in place). The linear layers that recompute their input (``--ops
recompute``, mmpola.ops.recompute) run theirs on the tokens of the grids: the MLP's GELU and fc2 with four
times the head dim's channels, the gated projection with the head dim's channels, its gate seen in a
projection of four times as many, and the LayerNorm with the linear layer after it with the head dim's
channels and four times as many (a patch merging's), also with its output taken apart into the attention's
operands (their gradients' kernel), a stage's last residual connection with its copy in another dtype, and a
patch embedding's LayerNorm with the positional encoding added (on maps of the head dim's channels, either layout).

Token grids: one head of many tokens (several token blocks per chunk) and two heads in a batch of two
of a few tokens (one block): launch code that takes another path for one head (FLatten) compiles both.
A kernel is compiled once per set of compile-time options and argument types.

Targets: the GPUs the launch configs are made for, sm_80 (A100, 163 KiB of shared memory per block), sm_90
(H100 / H200, 227 KiB) and sm_100 (B200, GB200: 227 KiB), and GPUs that give a block 99 KiB, sm_86 (A10,
A40, RTX 30xx), sm_89 (L4, L40, RTX 40xx) and sm_120 (RTX 50xx, RTX PRO Blackwell), where the ops turn down the
head dims and dtypes whose kernels do not fit (mmpola.ops.triton_support.SMALL_SHARED_MEMORY, or an op's own
table: PaCS's; 'auto' runs the fast path for them). The tensor-core products differ by generation (one warp's
each on sm_80, sm_86, sm_89 and sm_120; a warpgroup's on sm_90 and in tensor memory on sm_100 where the tiles
allow), and with them the kernels' registers: the launch code picks a kernel's form by that where it matters
(Pola's query backward: ``_join_weight_grads`` in mmpola/ops/pola_triton.py).

Prints one Markdown row per compiled kernel: dynamic shared memory, registers per thread, spilled
bytes (local memory), warps and stages, and one row per (op, dtype, head dim) an op turns down on a
target. Exits with status 1 when a kernel does not compile, when a config needs more shared memory than
sm_80 / sm_90 / sm_100 give a block, or when no config of a launch fits a 99 KiB target (the tuning skips the
configs that do not fit, so one that fits is enough there). Spills are reported, not failed. Compiled
kernels land in Triton's cache (TRITON_CACHE_DIR), so a second run of unchanged kernels takes seconds.

A tunable kernel's default config (what runs without tuning: the interpreter, torch's deterministic mode,
MMPOLA_TRITON_AUTOTUNE=0) is compiled too and marked ``(default)``; where it needs more shared memory than
the GPU gives a block, the first tuned config that fits runs instead (mmpola.ops.triton_support.launch) and
is marked so. The last line counts the configs that run without tuning and spill registers. ``--untuned``
compiles only those.

``--front-end`` stops after Triton's front end, which turns each kernel's Python into Triton IR for the
target: it checks what the interpreter lets pass (the types and shapes of every value, a variable that
changes type inside a loop, the compile-time branches each launch takes) of every kernel, with the first
of its tuned configs, in seconds; neither register use nor shared memory (rows say 'parsed'). The test
suite runs it.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import _mmpola_tools  # noqa: F401  (first: environment defaults before torch, repo on sys.path)

# the kernels must be compiled, not interpreted: decided when Triton and the ops are imported
os.environ['TRITON_INTERPRET'] = '0'

import torch  # noqa: E402

DTYPES = {'float32': torch.float32, 'float16': torch.float16, 'bfloat16': torch.bfloat16}
HEAD_DIMS = (16, 32, 64, 128)
# the depthwise convolution of the token maps (mmpola.ops.depthwise_conv2d), checked like an op: its
# channels are the head dims' column, at the kernel sizes of mmpola's models
DEPTHWISE = 'depthwise'
DEPTHWISE_KERNELS = (3, 5)
RECOMPUTE = 'recompute'  # the MLPs' GELU and fc2, Pola's gated projection (mmpola.ops.recompute), checked like an op
# (batch, heads, grid): many tokens in one head; a few tokens in two heads of a batch of two
SHAPES = ((1, 1, (40, 40)), (2, 2, (7, 7)))


class GPU:
    """A compile target: Triton's name of it, the shared memory a block may use, and what the ops'
    launch code is told of it."""

    def __init__(self, name, arch, warp_size, shared_kib, sm_count):
        self.name, self.arch, self.warp_size = name, arch, warp_size
        self.shared_limit = shared_kib * 1024
        self.sm_count = sm_count

    @property
    def full(self):
        """A GPU the launch configs are made for: every config of every kernel must fit it."""
        from mmpola.ops.triton_support import FULL_SHARED_MEMORY
        return self.shared_limit >= FULL_SHARED_MEMORY

    def triton_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget('cuda', self.arch, self.warp_size)

    def kernel_target(self):
        from mmpola.ops.triton_support import KernelTarget
        return KernelTarget(True, divmod(self.arch, 10), self.sm_count, self.shared_limit)


# A100 (sm_80): 163 KiB of shared memory per block, 108 SMs; H100 (sm_90): 227 KiB, 132 SMs; B200 (sm_100;
# GB200 alike): 227 KiB, 148 SMs; RTX 3090 (sm_86; A10, A40 alike): 99 KiB, 82 SMs; RTX 4090 (sm_89; L4, L40
# alike): 99 KiB, 128 SMs; RTX 5090 (sm_120; RTX PRO 6000 Blackwell alike): 99 KiB, 170 SMs
GPUS = {'sm_80': GPU('sm_80', 80, 32, 163, 108), 'sm_90': GPU('sm_90', 90, 32, 227, 132),
        'sm_100': GPU('sm_100', 100, 32, 227, 148), 'sm_86': GPU('sm_86', 86, 32, 99, 82),
        'sm_89': GPU('sm_89', 89, 32, 99, 128), 'sm_120': GPU('sm_120', 120, 32, 99, 170)}


def parse_args(argv=None):
    from mmpola.ops import OPS
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    triton_ops = [name for name, op in OPS.items() if 'triton' in op.impls] + [DEPTHWISE, RECOMPUTE]
    parser.add_argument('--ops', nargs='+', choices=triton_ops, default=triton_ops)
    parser.add_argument('--targets', nargs='+', choices=sorted(GPUS) + ['native'], default=sorted(GPUS),
                        help="GPUs to compile for; 'native': this machine's first CUDA GPU (its compute capability, "
                        'shared memory and multiprocessors)')
    parser.add_argument('--head-dims', nargs='+', type=int, default=list(HEAD_DIMS))
    parser.add_argument('--dtypes', nargs='+', choices=sorted(DTYPES), default=['float32', 'float16', 'bfloat16'])
    parser.add_argument('--kernels', nargs='+', default=None, help='compile only the kernels of these names')
    parser.add_argument('--jobs', type=int, default=1, help='compile in this many processes')
    parser.add_argument('--front-end', action='store_true',
                        help="only Triton's front end (Python to Triton IR): type and shape checks, seconds")
    parser.add_argument('--untuned', action='store_true',
                        help='only the config each launch runs without tuning (a tunable kernel\'s default)')
    return parser.parse_args(argv)


def native_gpu():
    """The :class:`GPU` of this machine's first CUDA device (``--targets native``)."""
    if not torch.cuda.is_available():
        sys.exit("error: --targets native needs a CUDA GPU on this machine; name targets instead (e.g. sm_90)")
    props = torch.cuda.get_device_properties(0)
    name = f'sm_{props.major}{props.minor}'
    return GPU(name, props.major * 10 + props.minor, 32, props.shared_memory_per_block_optin // 1024,
               props.multi_processor_count)


def record_launches(op_name, gpu, head_dim, dtype):
    """The kernel launches of one forward and backward of ``op_name``'s 'triton' implementation on
    ``gpu``, at every grid of SHAPES; a string instead when the op turns those inputs down on that GPU
    (its reason: the kernels do not fit its shared memory at that head dim and dtype)."""
    from mmpola.ops import OPS
    from mmpola.ops.dispatch import AttnImplUnavailable
    from mmpola.ops.triton_support import dry_run
    if op_name == DEPTHWISE:
        return record_depthwise_launches(gpu, head_dim, dtype)
    if op_name == RECOMPUTE:
        return record_recompute_launches(gpu, head_dim, dtype)
    op = OPS[op_name]
    launches = []
    for batch, heads, hw in SHAPES:
        tensors, options = op.example_inputs(batch, heads, hw, head_dim, torch.Generator().manual_seed(0))
        tensors = [(t.to(dtype) if i < 3 else t).requires_grad_() for i, t in enumerate(tensors)]
        # an op that takes a key bias gets one, of the keys' dtype and shared by the batch, as from the models
        bias = {'key_bias': torch.zeros(1, *tensors[1].shape[1:], dtype=dtype)} if op.records['triton'].key_bias \
            else {}
        with dry_run(gpu.kernel_target()) as recorded:
            try:
                out = op.impls['triton'](*tensors, *options, **bias)
            except AttnImplUnavailable as declined:
                return str(declined)
            out.backward(torch.zeros_like(out))
        launches += recorded
    return launches


def record_depthwise_launches(gpu, channels, dtype):
    """The kernel launches of one forward and backward of the Triton depthwise convolution on ``gpu``, with
    ``channels`` channels, at each kernel size of DEPTHWISE_KERNELS (and 3 with kernels per image, 5 on the
    heads' maps in their projection, both with a residual added, as InLine's and Pola's / FLatten's value terms
    run them, and 3 with the input as the residual, ``x + conv(x)``, as PolaFormer++'s blocks run it, whose
    backward adds the output's gradient in the input gradient's kernel) and every grid of SHAPES; in a half
    ``dtype`` also with float32 weights and bias under autocast (the models' parameters, read as they are)."""
    from mmpola.ops.depthwise_triton import depthwise_conv2d_triton
    from mmpola.ops.triton_support import dry_run
    launches = []
    for batch, heads, (height, width) in SHAPES:
        images = batch * heads
        # (kernel size, kernels per image, maps in a projection, the weights' dtype, the input as the residual)
        variants = [(k, False, False, dtype, False) for k in DEPTHWISE_KERNELS] + [
            (3, True, False, dtype, False), (5, False, True, dtype, False), (3, False, False, dtype, True)]
        if dtype != torch.float32:  # the models' float32 weights under autocast, read as they are
            variants += [(k, False, in_projection, torch.float32, identity)
                         for k, per_sample, in_projection, _, identity in variants if not per_sample]
        for k, per_sample, in_projection, weight_dtype, identity in variants:
            if in_projection:  # (B, h, C, H, W), a view of the (B, H*W, 4, h, C) projection
                x = torch.zeros(batch, height * width, 4, heads, channels, dtype=dtype).requires_grad_()
                x = x[:, :, 2].unflatten(1, (height, width)).permute(0, 3, 4, 1, 2)
            else:
                x = torch.zeros(images, height, width, channels, dtype=dtype).permute(0, 3, 1, 2).requires_grad_()
            shape = (images, channels) if per_sample else (channels, 1)
            weight = torch.zeros(*shape, k, k, dtype=weight_dtype).requires_grad_()
            bias = None if per_sample else torch.zeros(channels, dtype=weight_dtype).requires_grad_()
            residual = torch.zeros_like(x).requires_grad_() if per_sample or in_projection else x if identity else None
            with dry_run(gpu.kernel_target()) as recorded, \
                    torch.autocast('cpu', dtype, enabled=weight_dtype != dtype):
                out = depthwise_conv2d_triton(x, weight, bias, per_sample=per_sample, residual=residual)
                out.backward(torch.zeros_like(out))
                if in_projection:
                    _record_gated_value_term(x.detach(), weight.detach(), bias.detach(), residual.detach())
            launches += recorded
    return launches


def _record_gated_value_term(x, weight, bias, residual):
    """The depthwise kernels as Pola's joined value term runs them with its gate (mmpola.ops.value_term_triton),
    on the heads' maps ``x`` in their projection: the forward writing the gated output too, the weight gradient's
    kernel writing the gate's gradient and the gradient before the gate, and the input gradient added in place to
    the values' gradient."""
    from mmpola.ops.depthwise_triton import _convolve, _weight_grads
    total, _ = _convolve(x, weight, bias, False, False, residual=residual, gate=x)
    gated = torch.empty_like(total)
    grad_gate = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype)  # the gate's strides
    _weight_grads(x, weight, total, True, False, (True, True), (x, total, grad_gate, gated))
    _convolve(gated, weight, None, True, False, into=torch.empty_like(x))


def record_recompute_launches(gpu, channels, dtype):
    """The kernel launches of one forward and backward of each recomputing linear layer on ``gpu``, on the tokens
    of every grid of SHAPES: the MLP's GELU and fc2 (4 * ``channels`` hidden channels; without and with fc1's bias
    added before the GELU) and the gated projection (``channels`` channels, the gate a view of a projection of
    4 * ``channels``) and the LayerNorm with its linear layer (``channels`` and 4 * ``channels`` channels), also
    with a branch added to a float32 residual stream before it (``channels`` channels; without and with a factor
    per sample; none, the stream returned and its gradient added) and with its output taken apart into the
    attention's operands (three or four of ``channels`` channels, the values used twice), and the residual
    connection written with its copy in another dtype (without and with a factor, the gradients of both or of
    either, the sum in the tokens' layout or in its map's), and a patch embedding's LayerNorm with a float32
    positional encoding added (``channels`` channels, the map in either layout)."""
    from mmpola.ops import (
        add_layer_norm_linear,
        add_residual_and_cast,
        gated_linear,
        gelu_linear,
        layer_norm_add,
        layer_norm_linear,
    )
    from mmpola.ops.triton_support import dry_run
    launches = []
    for batch, _, (height, width) in SHAPES:
        tokens = (batch, height * width)
        h = torch.zeros(*tokens, 4 * channels, dtype=dtype).requires_grad_()
        s = torch.zeros(*tokens, channels, dtype=dtype).requires_grad_()
        projection = torch.zeros(*tokens, 4 * channels, dtype=dtype).requires_grad_()
        fc2, proj = (torch.zeros(channels, width, dtype=dtype).requires_grad_() for width in (4 * channels, channels))
        bias = torch.zeros(channels, dtype=dtype)
        fc1_bias = torch.zeros(4 * channels, dtype=dtype).requires_grad_()
        norms = [(torch.zeros(*tokens, width, dtype=dtype).requires_grad_(), torch.ones(width, dtype=dtype),
                  torch.zeros(width, dtype=dtype), torch.zeros(channels, width, dtype=dtype).requires_grad_())
                 for width in (channels, 4 * channels)]
        with dry_run(gpu.kernel_target()) as recorded:
            for out in (gelu_linear(h, fc2, bias, impl='triton'),
                        gelu_linear(h, fc2, bias, impl='triton', input_bias=fc1_bias),
                        gated_linear(s, projection[..., channels:2 * channels], proj, bias, impl='triton'),
                        *(layer_norm_linear(x, w, b, 1e-5, weight, bias, impl='triton') for x, w, b, weight in norms)):
                out.backward(torch.zeros_like(out))
            # as a model under autocast runs it: float32 stream and parameters, the branch in the autocast dtype
            branch = norms[0][0]
            stream = torch.zeros(branch.shape).requires_grad_()
            norm_weight, norm_bias = torch.ones(channels), torch.zeros(channels)
            weight = torch.zeros(channels, channels).requires_grad_()
            for scale in (None, torch.ones(batch, dtype=dtype)):
                with torch.autocast('cpu', dtype, enabled=dtype != torch.float32):
                    total, out = add_layer_norm_linear(stream, branch, norm_weight, norm_bias, 1e-5, weight,
                                                       impl='triton', scale=scale)
                torch.autograd.backward((total, out), (torch.zeros_like(total), torch.zeros_like(out)))
            # without a branch: the stream returned, its gradient from the layers after added in the kernel
            with torch.autocast('cpu', dtype, enabled=dtype != torch.float32):
                total, out = add_layer_norm_linear(stream, None, norm_weight, norm_bias, 1e-5, weight, impl='triton')
            torch.autograd.backward((total, out), (torch.zeros_like(total), torch.zeros_like(out)))
            # a stage's last residual connection written with the copy the next stage reads (under autocast: in the
            # autocast dtype; in float32, a bfloat16 copy), with the gradients of both and of one of them, the sum
            # in the tokens' layout or in its map's (its gradient too)
            copy_dtype = torch.bfloat16 if dtype == torch.float32 else dtype
            factors = torch.ones(batch, dtype=dtype)
            for scale, used, as_map in ((None, (True, True), False), (factors, (True, True), False),
                                        (factors, (False, True), False), (None, (True, False), False),
                                        (factors, (True, True), True), (None, (True, False), True)):
                total, copy = add_residual_and_cast(stream, branch, copy_dtype, scale, impl='triton', as_map=as_map)
                pairs = [(t, torch.zeros_like(t)) for t, use in zip((total, copy), used) if use]
                torch.autograd.backward(*zip(*pairs))
            # a patch embedding's output map (NCHW, channels-last) normalised with a float32 encoding added
            for memory_format in (torch.contiguous_format, torch.channels_last):
                maps = torch.zeros(batch, channels, height, width, dtype=dtype).contiguous(
                    memory_format=memory_format).requires_grad_()
                out = layer_norm_add(maps.flatten(2).transpose(1, 2), norm_weight, norm_bias, 1e-5,
                                     torch.zeros(1, height * width, channels), impl='triton')
                out.backward(torch.zeros_like(out))
            # a projection taken apart into the attention's operands, the values used twice: Pola's (q, k, v, g and
            # q, g, k, v) and FLatten's (q, k, v)
            x, w, b, _ = norms[0]
            for count, repeat in ((4, 2), (4, 3), (3, 2)):
                weight = torch.zeros(count * channels, channels, dtype=dtype).requires_grad_()
                operands = layer_norm_linear(x, w, b, 1e-5, weight, torch.zeros(count * channels, dtype=dtype),
                                             impl='triton', chunk=channels, repeat=(repeat, ))
                torch.autograd.backward(operands, [torch.zeros_like(o) for o in operands])
        launches += recorded
    return launches


def compilations(launch):
    """(jit function, launch options) of each kernel a launch can compile: one, or one per config of an
    autotuned kernel."""
    from triton.runtime.autotuner import Autotuner

    from mmpola.ops.triton_support import tuned_configs
    kernel = launch.kernel
    if isinstance(kernel, Autotuner):  # the configs Triton times for this launch (after its pruning)
        return [(kernel.fn, {**launch.kwargs, **config.all_kwargs()})
                for config in tuned_configs(kernel, launch.args, launch.kwargs)]
    return [(kernel, dict(launch.kwargs))]


def untuned_compilation(launch):
    """(jit function, launch options) of the kernel a launch runs without timing (mmpola.ops.triton_support.
    autotuning: the interpreter, torch's deterministic mode, MMPOLA_TRITON_AUTOTUNE=0): a tunable kernel's
    default config, which need not be one of its tuned configs."""
    from triton.runtime.autotuner import Autotuner
    if isinstance(launch.kernel, Autotuner):
        return launch.kernel.fn, {**launch.kwargs, **launch.default}
    return launch.kernel, dict(launch.kwargs)


def bind(fn, args, kwargs, target):
    """(signature, constexprs, attrs, options) of ``fn(*args, **kwargs)`` for ``target``, as a launch
    binds them (Triton's own binder)."""
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return signature, constexprs, attrs, options


def specialisations(launches, gpu):
    """{(kernel name, compile-time arguments, argument types): {Triton's specialisation attributes}} of the
    compilations that ``launches`` need on ``gpu``. Triton compiles a kernel config again for each new set
    of attributes (which integer and pointer arguments are divisible by 16, or equal to 1), so inputs of
    new shapes cost compilations only where they add a set."""
    found = {}
    target = gpu.triton_target()
    for launch in launches:
        for fn, kwargs in compilations(launch):
            signature, constexprs, attrs, _ = bind(fn, launch.args, kwargs, target)
            key = (fn.__name__, repr(sorted(constexprs.items(), key=repr)), repr(signature))
            found.setdefault(key, set()).add(repr(attrs))
    return found


def front_end(fn, signature, constexprs, attrs, options, target):
    """Triton's front end alone: the kernel as Triton IR for ``target`` (raises what it finds)."""
    from triton._C.libtriton import ir
    from triton.compiler import ASTSource, make_backend
    backend = make_backend(target)
    options = backend.parse_options(options.__dict__)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    source = ASTSource(fn, signature, constexprs, attrs)
    return source.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                          context)


def resource_usage(cubin, name):
    """(registers per thread, local memory bytes: spills and stack) of a compiled kernel."""
    from triton import knobs
    with tempfile.NamedTemporaryFile(suffix='.cubin') as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([knobs.nvidia.cuobjdump.path, '--dump-resource-usage', f.name], capture_output=True,
                              text=True, check=True).stdout
    fields = {}
    for line in text.splitlines():
        if 'REG:' in line:
            fields = dict(item.split(':', 1) for item in line.split() if ':' in item)
    return int(fields.get('REG', -1)), int(fields.get('LOCAL', 0)) + int(fields.get('STACK', 0))


def config_text(constexprs, fn, options):
    params = fn.params
    shown = {params[path[0]].name: value for path, value in constexprs.items()
             if len(path) == 1 and params[path[0]].is_constexpr and params[path[0]].name != 'ACC'}
    text = ' '.join(f'{k}={v}' for k, v in sorted(shown.items()) if not isinstance(v, bool) or v)
    return f'{text} warps={options.num_warps} stages={options.num_stages}'


def check_item(item):
    """The rows of one (target, op, dtype, head dim): every kernel its launches compile, once per set of
    compile-time options (the integer specialisations of the token grids are left to the first grid).

    A config that needs more shared memory than the target gives a block fails on the GPUs the launch
    configs are made for (``GPU.full``); on the others the tuning skips it, and the launch fails only
    when none of its configs fits. A tunable kernel's default config (the one that runs without tuning)
    is compiled too; where it does not fit, the first tuned config that fits runs instead
    (mmpola.ops.triton_support.launch). With ``untuned_only`` (``--untuned``) only those are compiled.
    Inputs the op turns down on the target give one row saying so."""
    gpu_name, op_name, dtype_name, head_dim, kernels, front_end_only, untuned_only = item
    gpu = GPUS[gpu_name]
    launches = record_launches(op_name, gpu, head_dim, DTYPES[dtype_name])
    if isinstance(launches, str):
        return [dict(op=op_name, kernel='-', target=gpu_name, dtype=dtype_name, d=head_dim, config='-', shared='-',
                     regs='-', spill='-', failed=False, declined=True, status=f'not run: {launches}'[:200])]
    rows, seen = [], {}
    for launch in launches:
        fn, untuned = untuned_compilation(launch)
        if kernels and fn.__name__ not in kernels:
            continue
        tunable = launch.default is not None
        if front_end_only:  # the front end: one config
            todo = compilations(launch)[:1]
        elif untuned_only:
            todo = [(fn, untuned)]
        else:  # every tuned config, and the default where it is not one of them
            todo = compilations(launch) + ([(fn, untuned)] if tunable else [])
        launch_rows = [compile_row(gpu, op_name, dtype_name, head_dim, launch, fn, kwargs, front_end_only, seen, rows,
                                   untuned='default' if kwargs is untuned else None, tunable=tunable)
                       for fn, kwargs in todo]
        default_row = next((row for row in launch_rows if row['untuned'] == 'default'), None)
        if default_row is not None and default_row['over'] and not gpu.full:
            # the default does not fit this GPU: the first tuned config that fits runs instead
            for fn, kwargs in compilations(launch):
                row = compile_row(gpu, op_name, dtype_name, head_dim, launch, fn, kwargs, False, seen, rows,
                                  untuned=None, tunable=True)
                launch_rows.append(row)
                if not row['over']:
                    row['untuned'] = row['untuned'] or 'fallback'
                    break
        if launch_rows and all(row['over'] for row in launch_rows):  # no config of this launch fits
            for row in launch_rows:
                row['failed'] = True
    for row in rows:
        if row['failed'] and not row['status'].startswith('FAILED'):
            row['status'] = f'FAILED: {row["status"]}'
        elif row['over']:
            row['status'] += ': skipped by the tuning' if not row['untuned'] else \
                ': the first tuned config that fits runs instead'
    return rows


def compile_row(gpu, op_name, dtype_name, head_dim, launch, fn, kwargs, front_end_only, seen, rows, untuned, tunable):
    """The row of one config of a launch's kernel: compiled once per (kernel, pointer types, config) in
    ``seen`` (a new row is appended to ``rows``). ``untuned``: the config is a tunable kernel's default
    (``'default'``), the config that runs where the default does not fit (``'fallback'``), or None."""
    import triton
    from triton.compiler import ASTSource
    name = fn.__name__
    target = gpu.triton_target()
    signature, constexprs, attrs, options = bind(fn, launch.args, kwargs, target)
    config = config_text(constexprs, fn, options)
    key = (name, str({k: v for k, v in signature.items() if v.startswith('*')}), config)
    if key in seen:
        seen[key]['untuned'] = seen[key]['untuned'] or untuned
        return seen[key]
    row = dict(op=op_name, kernel=name, target=gpu.name, dtype=dtype_name, d=head_dim, config=config, over=False,
               untuned=untuned, tunable=tunable)
    seen[key] = row
    rows.append(row)
    try:
        if front_end_only:
            front_end(fn, signature, constexprs, attrs, options, target)
            row.update(shared='-', regs='-', spill='-', failed=False, status='parsed')
            return row
        compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)
    except Exception as err:  # a kernel that does not compile is the finding
        message = [line for line in str(err).strip().splitlines() if line.strip()]
        row.update(shared='-', regs='-', spill='-', failed=True,
                   status=f'FAILED: {type(err).__name__}: {message[-1] if message else ""}'[:300])
        return row
    shared = compiled.metadata.shared
    regs, spill = resource_usage(compiled.asm['cubin'], name)
    row.update(shared=f'{shared / 1024:.1f}', regs=regs, spill=spill, failed=False,
               status='ok (spills)' if spill else 'ok')
    if shared > gpu.shared_limit:
        row.update(over=True, failed=gpu.full,
                   status=f'{shared / 1024:.0f} KiB of shared memory > {gpu.shared_limit // 1024} KiB')
    return row


def check(args):
    """Compile every item (in ``args.jobs`` processes); print the rows; (rows, number of failures)."""
    import itertools

    import triton
    items = [(*item, tuple(args.kernels or ()), args.front_end, args.untuned)
             for item in itertools.product(args.targets, args.ops, args.dtypes, args.head_dims)]
    start = time.time()
    if args.jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        pool = ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context('fork'))
        results = pool.map(check_item, items)
    else:
        pool, results = None, map(check_item, items)
    rows = []
    for item_rows in results:
        for row in item_rows:
            print_row(row)
        rows += item_rows
    if pool is not None:
        pool.shutdown()
    failures = sum(row['failed'] for row in rows)
    declined = sum(row.get('declined', False) for row in rows)
    compiled = len(rows) - declined
    done = 'parsed' if args.front_end else 'compiled'
    print(f'\n{compiled} kernels {done} for {", ".join(args.targets)} in {time.time() - start:.0f} s '
          f'(triton {triton.__version__}); {failures} failed; {declined} (op, dtype, head dim) not run on a '
          'target whose shared memory is too small for them')
    if not args.front_end:
        # the configs that run where nothing is tuned: the non-tunable kernels, the defaults that fit and
        # the configs that run instead of those that do not
        untuned = [row for row in rows if not row.get('declined') and not row['over']
                   and (row['untuned'] or not row['tunable'])]
        spilling = [row for row in untuned if isinstance(row['spill'], int) and row['spill'] > 0]
        print(f'{len(spilling)} of the {len(untuned)} configs that run without tuning spill registers')
    return rows, failures


HEADER = ('op', 'kernel', 'target', 'dtype', 'd', 'config', 'shared KiB', 'regs', 'spill B', 'status')


def print_row(row, _printed=[]):
    if not _printed:
        print('| ' + ' | '.join(HEADER) + ' |')
        print('|' + '---|' * len(HEADER))
        _printed.append(True)
    keys = ('op', 'kernel', 'target', 'dtype', 'd', 'config', 'shared', 'regs', 'spill', 'status')
    # a tunable kernel's default config (the one that runs without tuning), or what runs where it does not fit
    roles = {'default': ' (default)', 'fallback': ' (runs untuned: the default does not fit)'}
    role = roles.get(row.get('untuned'), '')
    shown = {**row, 'config': row['config'] + role}
    print('| ' + ' | '.join(str(shown[k]) for k in keys) + ' |', flush=True)


def main(argv=None):
    args = parse_args(argv)
    if 'native' in args.targets:
        gpu = native_gpu()
        GPUS['native'] = gpu
        print(f'native: {torch.cuda.get_device_name(0)}, {gpu.name}, {gpu.shared_limit // 1024} KiB of shared memory '
              f'per block, {gpu.sm_count} multiprocessors')
    from mmpola.ops.triton_support import triton_available
    reason = triton_available()
    if reason is not None:
        sys.exit(f'error: {reason}')
    _, failures = check(args)
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
