"""What the ``'triton'`` implementations of the attention ops share: where they run, and launch helpers.

The kernels run on CUDA tensors. With ``TRITON_INTERPRET=1`` (set before Triton is imported) Triton
runs them on the CPU through its interpreter, slowly but with the same arithmetic: that is how the
test suite checks them on machines without a GPU (tests/conftest.py sets it there).

The launch code of every op asks :func:`kernel_target` what it runs on (the interpreter, or a GPU of
some compute capability and number of multiprocessors) and launches through :func:`launch`. Inside
:func:`dry_run` both answer for a GPU named by the caller: the ops run on CPU tensors, every launch
is recorded instead of made, and tools/check_triton_kernels.py compiles the recorded kernels for
that GPU without one.

A kernel whose blocks are worth tuning (:func:`tunable`) is a ``triton.autotune`` over a few configs,
keyed on its compile-time head dim block and the arguments' dtypes, never on the token count (it
changes at every detection iteration). :func:`launch` with ``default=`` runs it: on a GPU Triton picks
the fastest config at the first launch of a key; under the interpreter, in torch's deterministic mode
(``torch.use_deterministic_algorithms(True)``) and inside :func:`fixed_config` it runs one given config
(the launch code's ``default``, or the named one) without timing. The launch code makes the grids and
the partial-sum buffers independent of the config (token chunks are multiples of every config's
block; a grid of token blocks is a function of the config's block), so a config changes the order of
the float32 additions inside a chunk, never the chunks: results of two configs agree to rounding, and
two runs that pick the same config agree exactly.
"""
import contextlib
import functools
import importlib.util
import os
from typing import NamedTuple

import torch

__all__ = ['interpreting', 'triton_available', 'triton_unsupported', 'KERNEL_DTYPES', 'KernelTarget',
           'kernel_target', 'launch', 'dry_run', 'Launch', 'tunable', 'fixed_config']

# the input dtypes the kernels load (they accumulate in float32; float64 only in the interpreter)
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def interpreting():
    """True when Triton runs kernels through its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get('TRITON_INTERPRET', '0') not in ('', '0')


@functools.lru_cache(maxsize=None)
def triton_available():
    """None when the ``triton`` package imports, else why not."""
    if importlib.util.find_spec('triton') is None:
        return 'the triton package is not installed (pip install triton; it ships with CUDA builds of torch)'
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as err:  # a broken install
        return f'triton does not import ({type(err).__name__}: {str(err).strip().splitlines()[0][:120]})'
    return None


@functools.lru_cache(maxsize=None)
def _cuda_unsupported(index):
    major, minor = torch.cuda.get_device_capability(index)
    if major < 7 or (major, minor) < (7, 5):
        return (f'the Triton kernels need a GPU of compute capability 7.5 or newer, this one is {major}.{minor}; '
                "use attn_impl='fast'")
    return None


def triton_unsupported(device, dtype=None):
    """None when the Triton kernels run on tensors of ``device`` and ``dtype``, else why not (one line).

    CUDA tensors of float32 / float16 / bfloat16 on a GPU of compute capability >= 7.5 (bfloat16:
    >= 8.0); CPU tensors only under ``TRITON_INTERPRET=1`` (float64 too, for tests).
    """
    device = torch.device(device)
    reason = triton_available()
    if reason is not None:
        return reason
    if _DRY_RUNS and device.type == 'cpu':
        ok = dtype is None or dtype in KERNEL_DTYPES
        return None if ok else f'the Triton kernels take float32, float16 or bfloat16 tensors, got {dtype}'
    if device.type == 'cpu':
        if not interpreting():
            return ("the Triton kernels run on CUDA tensors, these are on the CPU; use attn_impl='auto' or "
                    "'fast' there (TRITON_INTERPRET=1 runs the kernels on the CPU, slowly, for tests)")
        if dtype is not None and dtype not in KERNEL_DTYPES + (torch.float64,):
            return f'the Triton kernels take float32, float16 or bfloat16 tensors, got {dtype}'
        return None
    if device.type != 'cuda':
        return f"the Triton kernels run on CUDA tensors, these are on {device.type}; use attn_impl='fast'"
    if dtype is not None and dtype not in KERNEL_DTYPES:
        return f"the Triton kernels take float32, float16 or bfloat16 CUDA tensors, got {dtype}; use attn_impl='fast'"
    index = device.index if device.index is not None else torch.cuda.current_device()
    reason = _cuda_unsupported(index)
    if reason is None and dtype == torch.bfloat16 and torch.cuda.get_device_capability(index)[0] < 8:
        reason = "bfloat16 Triton kernels need a GPU of compute capability 8.0 or newer; use attn_impl='fast'"
    return reason


class KernelTarget(NamedTuple):
    """What the launch code knows of where the kernels run."""
    gpu: bool  # False: Triton's CPU interpreter
    capability: tuple  # (major, minor) compute capability of the GPU; (0, 0) in the interpreter
    sm_count: int  # streaming multiprocessors of the GPU; the interpreter counts as 2


INTERPRETER = KernelTarget(False, (0, 0), 2)


@functools.lru_cache(maxsize=None)
def _cuda_target(index):
    props = torch.cuda.get_device_properties(index)
    return KernelTarget(True, (props.major, props.minor), props.multi_processor_count)


def kernel_target(device):
    """The :class:`KernelTarget` the kernels on tensors of ``device`` run on (inside :func:`dry_run`: its
    target)."""
    if _DRY_RUNS:
        return _DRY_RUNS[-1].target
    device = torch.device(device)
    if device.type != 'cuda' or interpreting():
        return INTERPRETER
    return _cuda_target(device.index if device.index is not None else torch.cuda.current_device())


class Launch(NamedTuple):
    """One kernel launch: the kernel (a ``triton.jit`` function or an autotuner over one), its grid,
    arguments and launch options."""
    kernel: object
    grid: tuple
    args: tuple
    kwargs: dict


class _DryRun:

    def __init__(self, target):
        self.target = target
        self.launches = []


_DRY_RUNS = []


def tunable(configs, key, prune=None):
    """Decorator of a ``triton.jit`` kernel: ``triton.autotune`` over ``configs`` (``triton.Config`` of
    its tuned compile-time arguments and warps), keyed on the kernel arguments named in ``key`` and the
    tensors' dtypes; ``prune(configs, named_args, **kwargs)`` keeps those worth timing for a launch (e.g.
    the blocks that fit a head dim). Launch it with :func:`launch` and ``default=``."""
    import triton

    def wrap(fn):
        prune_by = None if prune is None else {'early_config_prune': prune}
        return triton.autotune(configs=list(configs), key=list(key), prune_configs_by=prune_by)(fn)

    return wrap


_FIXED = []


@contextlib.contextmanager
def fixed_config(index):
    """Inside, every tunable kernel runs its config number ``index`` (tests of each config)."""
    _FIXED.append(index)
    try:
        yield
    finally:
        _FIXED.pop()


def launch(kernel, grid, *args, default=None, **kwargs):
    """``kernel[grid](*args, **kwargs)``; inside :func:`dry_run` the launch is recorded instead.

    A :func:`tunable` kernel takes ``default``, the config (compile-time arguments and ``num_warps``)
    that runs where no timing may choose: under the interpreter and in torch's deterministic mode;
    :func:`fixed_config` picks one of its configs instead. ``grid`` may be a function of the config's
    compile-time arguments (``lambda meta: (heads, triton.cdiv(tokens, meta['BLOCK_N']))``).
    """
    if _DRY_RUNS:
        _DRY_RUNS[-1].launches.append(Launch(kernel, grid, args, kwargs))
        return
    if default is not None:
        if _FIXED:
            kwargs = {**kwargs, **kernel.configs[_FIXED[-1]].all_kwargs()}
            kernel = kernel.fn
        elif interpreting() or torch.are_deterministic_algorithms_enabled():
            kwargs = {**kwargs, **default}
            kernel = kernel.fn
    kernel[grid](*args, **kwargs)


@contextlib.contextmanager
def dry_run(target):
    """Yield the list of the :class:`Launch` es that the ops make inside, on CPU tensors of the kernels'
    dtypes, as they would make them on a GPU of :class:`KernelTarget` ``target``; nothing is launched
    (outputs and gradients are left uninitialised)."""
    run = _DryRun(target)
    _DRY_RUNS.append(run)
    try:
        yield run.launches
    finally:
        _DRY_RUNS.remove(run)


if triton_available() is None:
    import triton
    import triton.language as tl

    @triton.jit
    def batch_and_head(bh, H):
        """(batch, head) of the flat index ``bh = batch * H + head`` of a program's head, as int64 (they
        scale offsets into tensors that may pass 2**31 elements)."""
        return (bh // H).to(tl.int64), (bh % H).to(tl.int64)
