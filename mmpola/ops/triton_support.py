"""What the ``'triton'`` implementations of the attention ops share: where they run, and launch helpers.

The kernels run on CUDA tensors. With ``TRITON_INTERPRET=1`` (set before mmpola.ops is imported) Triton
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
the fastest config at the first launch of a key (it compiles and times each config once per process;
compiled kernels stay in Triton's disk cache for later processes), and later launches of the key run that
config without the autotuner (:func:`tuning_key`); under the interpreter, in torch's
deterministic mode (``torch.use_deterministic_algorithms(True)``), with ``MMPOLA_TRITON_AUTOTUNE=0`` and
inside :func:`fixed_config` it runs one given config (the launch code's ``default``, or the named one)
without timing. The launch code makes the grids and the partial-sum buffers independent of the config
(token chunks are multiples of every config's block; a grid of token blocks is a function of the
config's block), so a config changes the order of the float32 additions inside a chunk, never the
chunks: results of two configs agree to rounding, and two runs that pick the same config agree exactly.

The launch configs are made for an A100's shared memory (:data:`FULL_SHARED_MEMORY`). On GPUs that give
a block less, :func:`triton_unsupported` turns down the head dims and dtypes whose kernels do not fit
(:data:`SMALL_SHARED_MEMORY`), so ``attn_impl='auto'`` runs the fast path there; the configs that do
not fit are skipped by the tuning (Triton times them as failed) and by :func:`launch`'s default.
"""
import contextlib
import functools
import importlib.util
import itertools
import operator
import os
from typing import NamedTuple, Optional

import torch

from .dispatch import AttnImplUnavailable, autocast_dtype

__all__ = ['interpreting', 'triton_available', 'triton_unsupported', 'KERNEL_DTYPES', 'KernelTarget',
           'kernel_target', 'launch', 'dry_run', 'dry_running', 'Launch', 'tunable', 'fixed_config', 'autotuning',
           'FULL_SHARED_MEMORY', 'shared_memory_unsupported', 'tuned_configs', 'key_bias_args',
           'on_the_tensors_device', 'require_triton', 'autocast_operands', 'dot_precision', 'relaunch',
           'tuning_key', 'choices_kept']

# the input dtypes the kernels load (they accumulate in float32; float64 only in the interpreter)
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# Triton makes a kernel an interpreted one where ``TRITON_INTERPRET=1`` when the kernel is defined (``triton.jit``
# reads it then), and mmpola's kernels are defined when mmpola.ops is imported: the variable as it was then.
_INTERPRETING = os.environ.get('TRITON_INTERPRET', '0') not in ('', '0')


def interpreting():
    """True when Triton runs mmpola's kernels through its CPU interpreter: ``TRITON_INTERPRET=1`` when they were
    defined, at the import of mmpola.ops (setting it later changes neither them nor this answer). The launch
    code asks at every launch and check; the environment is not read again."""
    return _INTERPRETING


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
    if major < 8:  # the kernels' products are TF32 tensor-core products (Ampere on); compiled for sm_80 and later
        return (f'the Triton kernels need a GPU of compute capability 8.0 or newer, this one is {major}.{minor}; '
                "use attn_impl='fast'")
    return None


def triton_unsupported(device, dtype=None, head_dim=None, small_shared_memory=None):
    """None when the Triton kernels run on tensors of ``device`` and ``dtype`` (with heads of ``head_dim``
    channels, when given), else why not (one line).

    CUDA tensors of float32 / float16 / bfloat16 on a GPU of compute capability >= 8.0 whose shared
    memory holds the kernels at that head dim (:func:`shared_memory_unsupported`, by an op's own table
    ``small_shared_memory`` where it has one); CPU tensors only under ``TRITON_INTERPRET=1`` (float64 too,
    for tests).
    """
    device = torch.device(device)
    reason = triton_available()
    if reason is not None:
        return reason
    if _DRY_RUNS and device.type == 'cpu':
        if dtype is not None and dtype not in KERNEL_DTYPES:
            return f'the Triton kernels take float32, float16 or bfloat16 tensors, got {dtype}'
        return shared_memory_unsupported(_DRY_RUNS[-1].target, head_dim, dtype, small_shared_memory)
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
    if reason is None and not interpreting():
        reason = shared_memory_unsupported(_cuda_target(index), head_dim, dtype, small_shared_memory)
    return reason


def require_triton(tensor, what, switch):
    """Raise :class:`~mmpola.ops.dispatch.AttnImplUnavailable` when the Triton kernels of ``what`` cannot run on
    ``tensor`` (:func:`triton_unsupported`), naming the library path as the way out: ``impl='torch'`` or what
    chose the kernels, ``switch`` (e.g. ``'MMPOLA_DEPTHWISE_CONV=torch'``, the environment variable that switches a
    whole run; a function that says it, called only for the message)."""
    reason = triton_unsupported(tensor.device, tensor.dtype)
    if reason is not None:
        reason = reason.split('; use ')[0]  # the alternative here is the library's path
        switch = switch() if callable(switch) else switch
        raise AttnImplUnavailable(f"{what} cannot run here: {reason}; use impl='torch' ({switch})")


def autocast_operands(device_type, *tensors):
    """``tensors`` cast to the autocast dtype of ``device_type`` where autocast is on there (None kept), as the
    library's convolutions and linear layers cast theirs; else as they are."""
    dtype = autocast_dtype(device_type)
    if dtype is None:
        return tensors
    return tuple(None if t is None else t.to(dtype) for t in tensors)


# The shared memory a block may use that the kernels' launch configs are made for: an A100's 163 KiB
# (H100 / H200, B200: 227 KiB). ``make check-kernels`` holds every config of every kernel to it on sm_80, sm_90 and
# sm_100.
FULL_SHARED_MEMORY = 163 * 1024

# GPUs that give a block less (A10, A40, RTX 30xx / 40xx / 50xx, L4, L40: 99 KiB): per amount of shared
# memory, the widest head dim (its power-of-two block) at which every kernel of every op has a config that
# fits, for float16 / bfloat16 inputs and for float32 inputs (whose three-TF32 products keep split operands
# in shared memory); an op whose kernels fit wider heads passes its own table (``small_shared_memory``).
# ``make check-kernels`` compiles the kernels for such GPUs (sm_86, sm_89, sm_120) and fails where a table admits a
# kernel that does not fit.
SMALL_SHARED_MEMORY = ((99 * 1024, {'half': 64, 'float32': 32}), )


def _dtype_name(dtype):
    return str(dtype).replace('torch.', '')


def shared_memory_unsupported(target, head_dim, dtype=None, small_shared_memory=None):
    """None when the kernels at head dim ``head_dim`` on ``dtype`` inputs fit the shared memory of
    :class:`KernelTarget` ``target`` (always under the interpreter, on GPUs with
    :data:`FULL_SHARED_MEMORY` or more, and when ``head_dim`` is None), else why not (one line).
    ``small_shared_memory``: an op's own table in the form of :data:`SMALL_SHARED_MEMORY` (the default)."""
    if head_dim is None or not target.gpu or not target.shared_memory or target.shared_memory >= FULL_SHARED_MEMORY:
        return None
    block = max(16, 1 << (int(head_dim) - 1).bit_length())
    kind = 'float32' if dtype in (None, torch.float32) else 'half'
    table = SMALL_SHARED_MEMORY if small_shared_memory is None else small_shared_memory
    widest = next((limits[kind] for memory, limits in table if target.shared_memory >= memory), 0)
    if block <= widest:
        return None
    runs = (f'they run float32 inputs up to head dim {widest} there' if kind == 'float32' else
            f'they run float16 / bfloat16 inputs up to head dim {widest} there') if widest else 'they do not run there'
    return (f'this GPU gives a block {target.shared_memory // 1024} KiB of shared memory, too little for the Triton '
            f'kernels at head dim {head_dim} on {_dtype_name(dtype or torch.float32)} inputs ({runs}); '
            "use attn_impl='fast'")


class KernelTarget(NamedTuple):
    """What the launch code knows of where the kernels run."""
    gpu: bool  # False: Triton's CPU interpreter
    capability: tuple  # (major, minor) compute capability of the GPU; (0, 0) in the interpreter
    sm_count: int  # streaming multiprocessors of the GPU; the interpreter counts as 2
    shared_memory: int = 0  # bytes of shared memory a block may use (opt-in); 0: no limit (the interpreter)

    @property
    def warp_products(self):
        """Whether Triton runs the kernels' tensor-core products one warp each (``mma.sync``, the accumulator tile
        split over a warp's registers) whatever their tiles: GPUs of compute capability 8.x (A100, A10, RTX 30xx /
        40xx, L4, L40) and 12.x (RTX 50xx, RTX PRO Blackwell, DGX Spark). On 9.x (H100 / H200) it runs the tiles
        that allow it as warpgroup products and on 10.x and 11.x (B200, B300, GB200, Thor) in tensor memory, which
        lay out a kernel's registers otherwise. False in the interpreter."""
        return self.gpu and self.capability[0] not in (9, 10, 11)


INTERPRETER = KernelTarget(False, (0, 0), 2)


@functools.lru_cache(maxsize=None)
def _cuda_target(index):
    props = torch.cuda.get_device_properties(index)
    shared = getattr(props, 'shared_memory_per_block_optin', 0)
    if not shared:  # torch builds without the property: Triton's driver knows it
        from triton.runtime import driver
        shared = driver.active.utils.get_device_properties(index)['max_shared_mem']
    return KernelTarget(True, (props.major, props.minor), props.multi_processor_count, int(shared))


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
    arguments and launch options, and a tunable kernel's default config (:func:`launch`)."""
    kernel: object
    grid: tuple
    args: tuple
    kwargs: dict
    default: Optional[dict] = None


class _DryRun:

    def __init__(self, target):
        self.target = target
        self.launches = []


_DRY_RUNS = []


_INTERPRETER_DEFAULTS = {}  # tunable kernel: what Triton's interpreter runs over its launch's default
_TUNERS = []  # every tunable kernel


def tunable(configs, key, prune=None, interpreter=None):
    """Decorator of a ``triton.jit`` kernel: ``triton.autotune`` over ``configs`` (``triton.Config`` of
    its tuned compile-time arguments and warps), keyed on the kernel arguments named in ``key`` and the
    tensors' dtypes; ``prune(configs, named_args, **kwargs)`` keeps those worth timing for a launch (e.g.
    the blocks that fit a head dim). Launch it with :func:`launch` and ``default=``. ``interpreter``:
    compile-time arguments that Triton's interpreter runs instead of the default's (larger blocks: its time
    goes per program and per operation, not per element); a GPU, a dry run and :func:`fixed_config` never
    see them."""
    import triton

    def wrap(fn):
        prune_by = None if prune is None else {'early_config_prune': prune}
        tuner = triton.autotune(configs=list(configs), key=list(key), prune_configs_by=prune_by)(fn)
        if interpreter:
            _INTERPRETER_DEFAULTS[tuner] = dict(interpreter)
        _TUNERS.append(tuner)
        return tuner

    return wrap


_FIXED = []


@contextlib.contextmanager
def fixed_config(index):
    """Inside, every tunable kernel runs its config number ``index`` (tests of each config); on a GPU a
    launch whose pruning leaves that config out runs its default."""
    _FIXED.append(index)
    try:
        yield
    finally:
        _FIXED.pop()


def autotune_asked():
    """Whether the environment leaves Triton's tuning on: False for ``MMPOLA_TRITON_AUTOTUNE`` 0 / false / no /
    off, True otherwise (unset included)."""
    return os.environ.get('MMPOLA_TRITON_AUTOTUNE', '1').strip().lower() not in ('0', 'false', 'no', 'off')


def autotuning():
    """False where a tunable kernel runs its launch code's default config without timing others: under
    the interpreter, in torch's deterministic mode and with ``MMPOLA_TRITON_AUTOTUNE=0``."""
    if interpreting() or torch.are_deterministic_algorithms_enabled():
        return False
    return autotune_asked()


def launch(kernel, grid, *args, default=None, **kwargs):
    """``kernel[grid](*args, **kwargs)``; inside :func:`dry_run` the launch is recorded instead.

    A :func:`tunable` kernel takes ``default``, the config (compile-time arguments and ``num_warps``)
    that runs where no timing may choose (:func:`autotuning`; in the interpreter with the kernel's own
    ``interpreter`` arguments over it, where it has them); :func:`fixed_config` picks one of its configs
    instead. When the default needs more shared memory than the GPU gives a block, the first of
    the kernel's configs that fits runs instead (the launch fails before any work, and every config
    gives the same chunks). ``grid`` may be a function of the config's compile-time arguments
    (``lambda meta: (heads, cdiv(tokens, meta['BLOCK_N']))``).
    """
    if _DRY_RUNS:
        _DRY_RUNS[-1].launches.append(Launch(kernel, grid, args, kwargs, default))
        return
    with on_the_tensors_device(args):
        _launch(kernel, grid, args, kwargs, default)


@contextlib.contextmanager
def choices_kept():
    """A context after which the configs every tunable kernel has chosen are those it had chosen before it (its
    autotuner's and :func:`launch`'s records, the configs that ran where a default did not fit, the direct
    launches' records): for a benchmark whose launches time nothing (a driver that stands in for a GPU's:
    tools/benchmark_host.py), so that what it chose untimed is not what later launches run. Inside, the
    autotuners keep no choice on disk (Triton's ``TRITON_CACHE_AUTOTUNING``, which later processes of the same GPU
    would read) and log none (``TRITON_PRINT_AUTOTUNING``)."""
    chosen, tuned = dict(_CHOSEN), [dict(tuner.cache) for tuner in _TUNERS]
    fitting, did_not_fit, direct = dict(_FITTING), set(_DID_NOT_FIT), dict(_DIRECT)
    on_disk = [getattr(tuner, 'cache_results', False) for tuner in _TUNERS]
    for tuner in _TUNERS:
        tuner.cache_results = False
    try:
        with _autotuning_log_off():
            yield
    finally:
        for tuner, cache_results in zip(_TUNERS, on_disk):
            tuner.cache_results = cache_results
        _CHOSEN.clear()
        _CHOSEN.update(chosen)
        _FITTING.clear()
        _FITTING.update(fitting)
        _DID_NOT_FIT.clear()
        _DID_NOT_FIT.update(did_not_fit)
        _DIRECT.clear()  # the direct launches of configs chosen inside
        _DIRECT.update(direct)
        for tuner, cache in zip(_TUNERS, tuned):
            tuner.cache.clear()
            tuner.cache.update(cache)


@contextlib.contextmanager
def _autotuning_log_off():
    """A context without Triton's log of each tuning (``TRITON_PRINT_AUTOTUNING``; a Triton without ``knobs``: as
    it is)."""
    try:
        from triton import knobs
        settings = knobs.autotuning
    except (ImportError, AttributeError):
        yield
        return
    with settings.scope():
        settings.print = False
        yield


def relaunch(recorded):
    """Make a :class:`Launch` that :func:`dry_run` recorded, as :func:`launch` makes one outside a dry run (Triton
    launches it on the current device): for a benchmark that sends a step's launches down Triton's own launch
    path to a driver that stands in for a GPU's (tools/benchmark_host.py)."""
    _launch(recorded.kernel, recorded.grid, recorded.args, recorded.kwargs, recorded.default)


def on_the_tensors_device(args):
    """A context that makes the device of the first CUDA tensor in ``args`` the current CUDA device, where it is
    not: Triton launches a kernel on the current device, whatever its tensors' (a model on ``cuda:1`` in a
    process whose current device is 0, e.g. an inferencer given ``device='cuda:1'``)."""
    tensor = next((a for a in args if getattr(a, 'is_cuda', False)), None)
    if tensor is None or tensor.device.index is None or tensor.device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(tensor.device.index)


def _launch(kernel, grid, args, kwargs, default):
    if default is not None:
        if _FIXED:
            config = kernel.configs[_FIXED[-1]]
            if not interpreting() and not any(config is kept for kept in tuned_configs(kernel, args, kwargs)):
                config = None  # on a GPU, not one this launch is tuned over (may not fit its shared memory)
            kwargs = {**kwargs, **(default if config is None else config.all_kwargs())}
            kernel = kernel.fn
        elif not autotuning():
            if kernel in _INTERPRETER_DEFAULTS and interpreting():
                default = {**default, **_INTERPRETER_DEFAULTS[kernel]}
            _launch_first_fitting(kernel, grid, args, kwargs, default)
            return
        else:
            _launch_tuned(kernel, grid, args, kwargs)
            return
    _run(kernel, grid, args, kwargs)


# the config each tunable kernel's autotuner chose, by what it keys the choice on (:func:`tuning_key`): the
# autotuner computes its key from every argument at each launch, a host cost about that of the launch itself, so
# a launch of a key it has chosen for goes to the kernel with that config directly
_CHOSEN = {}
_TENSOR_POSITIONS = {}  # (tunable kernel, number of arguments): where its launches pass tensors (its pointers)


def tuning_key(tuner, args, kwargs):
    """What autotuner ``tuner`` keys its choice of config on for a launch with ``args`` and ``kwargs``: the
    values of its key arguments and the dtypes of the tensor arguments (found at the positions of the kernel's
    first launch with as many arguments, its pointers; all are looked at where those hold no tensor)."""
    key = [kwargs[name] if name in kwargs else args[tuner.arg_names.index(name)] for name in tuner.keys]
    positions = _TENSOR_POSITIONS.get((tuner, len(args)))
    if positions is None:
        positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        _TENSOR_POSITIONS[tuner, len(args)] = positions
    try:
        key += [args[i].dtype for i in positions]
    except AttributeError:
        key += [None] + [a.dtype for a in args if isinstance(a, torch.Tensor)]
    key += [v.dtype for v in kwargs.values() if isinstance(v, torch.Tensor)]
    return tuple(key)


def _launch_tuned(tuner, grid, args, kwargs):
    """Launch tunable kernel ``tuner`` with the config its autotuner chose for this launch's key: through the
    autotuner the first time (it compiles and times its configs where it has not chosen yet), then directly."""
    if not hasattr(tuner, 'keys'):  # a Triton whose autotuner does not say what it keys on: its own path
        tuner[grid](*args, **kwargs)
        return
    if _direct(tuner, tuner.fn, grid, args, kwargs) is not None:  # a launch like one the config was chosen for
        return
    key = (tuner, tuning_key(tuner, args, kwargs))
    chosen = _CHOSEN.get(key)
    if chosen is not None:
        # Triton's path, remembered for the autotuner's launches like it (those of its kernel are not looked up)
        launch_kwargs = {**kwargs, **chosen}
        _remember(tuner, tuner.fn, args, kwargs, launch_kwargs, tuner.fn[grid](*args, **launch_kwargs))
        return
    tuner[grid](*args, **kwargs)
    config = getattr(tuner, 'best_config', None)  # what it chose (a Triton that does not say: its path each time)
    if config is not None and getattr(config, 'pre_hook', None) is None:  # a config's hook runs at each launch
        _CHOSEN[key] = config.all_kwargs()


# Direct launches. Triton's launch of a jitted kernel (``kernel[grid](*args)``, JITFunction.run) binds every
# argument to its parameter, works out each argument's specialisation (a pointer's dtype and whether it is 16-byte
# aligned; whether an int is 1, a multiple of 16, or beyond 32 bits; a constexpr's value), makes a string of that
# and of the options to look the compiled kernel up, checks the kernel's globals, builds the launch's metadata
# for its hooks and then calls the compiled kernel's launcher: the host's time of that path is several times the
# launcher's. A launch that repeats one made before (the same kernel and keyword arguments, the same values and
# types of the other arguments, tensors of the same dtypes at the same addresses modulo 16) calls the launcher
# of the kernel that Triton's path chose then, with the same arguments (:func:`_run`): Triton specialises
# a pointer on its dtype and its 16-byte alignment only, and everything else by its value and type. The
# positions of the tensors are planned at the first launch (:class:`_Plan`); a launch that the plan does not
# foresee (a tensor where there was none, or none where there was one), a launch hook and a pre-run hook take
# Triton's path. tests/ops/test_triton_support.py holds the installed Triton to the pointers' rule and the
# launcher's calls to those of Triton's path; releases not in DIRECT_TRITON take Triton's path at every launch.
DIRECT_TRITON = ('3.6', '3.7')
_DIRECT_MAX = 1 << 15  # direct keys kept, the oldest given up first (a key per input size and launch)


def _getter(positions):
    """A function of a tuple that returns a tuple of its items at ``positions`` (itemgetter's, in C)."""
    if len(positions) > 1:
        return operator.itemgetter(*positions)
    return (lambda values: (values[positions[0]], )) if positions else (lambda values: ())


class _Plan:
    """Where the launches of a kernel (or of an autotuner over it) with a given number of positional arguments and
    keyword names put their tensors (:func:`_direct_key` keys them on dtype and address modulo 16) and their other
    arguments (on value, with the types of the first launch: a launch with others takes Triton's path)."""
    __slots__ = ('owner', 'tensors', 'others', 'types', 'keyword_types')

    def __init__(self, owner, args, kwargs):
        self.owner = owner  # kept: the plans are found by the owner's id, which nothing else takes while it lives
        tensors = [i for i, value in enumerate(args) if isinstance(value, torch.Tensor)]
        self.tensors = _getter(tensors)
        self.others = _getter([i for i in range(len(args)) if i not in tensors])
        self.types = tuple(map(type, self.others(args)))
        self.keyword_types = tuple(map(type, kwargs.values()))


_PLANS = {}  # (id of the kernel or autotuner, number of positional arguments, keyword names...) -> _Plan
_DIRECT = {}  # direct key (:func:`_direct_key`) -> (compiled kernel, the values of the parameters after the
# positional arguments, the keyword arguments of Triton's launch: an autotuner's config among them)
_ON = []  # [the direct launches' state]: (Triton's driver config, its runtime knobs) where they run, else None
_DTYPE, _ADDRESS, _LOW_BITS = operator.attrgetter('dtype'), operator.methodcaller('data_ptr'), itertools.repeat(15)


def _direct_state():
    if not _ON:
        state = None
        if not interpreting() and triton_available() is None:
            import triton
            if '.'.join(triton.__version__.split('.')[:2]) in DIRECT_TRITON:
                from triton import knobs
                from triton.runtime import driver
                state = driver, knobs.runtime
        _ON.append(state)
    return _ON[0]


def _direct_key(plan, device, args, kwargs):
    """The key of a launch under ``plan``: equal for two launches only where Triton specialises their arguments
    alike (module comment above :data:`DIRECT_TRITON`). Raises TypeError where the arguments' types are not the
    plan's, AttributeError where a tensor of the plan is not one."""
    values, tensors, others = kwargs.values(), plan.tensors(args), plan.others(args)
    if tuple(map(type, others)) != plan.types or tuple(map(type, values)) != plan.keyword_types:
        raise TypeError('not as planned')
    return (plan, device, *values, *others, *map(_DTYPE, tensors),
            *map(operator.and_, map(_ADDRESS, tensors), _LOW_BITS))


def _direct(owner, kernel, grid, args, kwargs):
    """Launch jitted ``kernel`` directly where a launch like this one of ``owner`` (the kernel, or an autotuner over
    it) was made before (module comment above :data:`DIRECT_TRITON`): the compiled kernel launched, else None."""
    state = _direct_state()
    plan = _PLANS.get((id(owner), len(args), *kwargs)) if state is not None else None
    if plan is None:
        return None
    driver, runtime = state
    if kernel.pre_run_hooks or getattr(runtime.launch_enter_hook, 'calls', True) or \
            getattr(runtime.launch_exit_hook, 'calls', True) or \
            getattr(runtime, 'add_stages_inspection_hook', None) is not None:  # what Triton's path runs each time
        return None
    device = driver.active.get_current_device()
    try:
        entry = _DIRECT.get(_direct_key(plan, device, args, kwargs))
        if entry is None:
            return None
        compiled, tail, launch_kwargs = entry
        if callable(grid):
            grid = grid(launch_kwargs)
    except (TypeError, AttributeError, KeyError):  # not as planned (other kinds, unhashable, a grid's name)
        return None
    size = len(grid)
    # the call of JITFunction.run, without its hooks' launch metadata (no launch hook is set)
    compiled.run(grid[0], grid[1] if size > 1 else 1, grid[2] if size > 2 else 1,
                 driver.active.get_current_stream(device), compiled.function, compiled.packed_metadata, None, None,
                 None, *args, *tail)
    return compiled


def _remember(owner, kernel, args, kwargs, launch_kwargs, compiled):
    """Keep ``compiled``, what Triton's path launched for ``kernel[grid](*args, **launch_kwargs)``, for the launches
    of ``owner`` (the kernel, or an autotuner over it that chose a config) like this one with ``kwargs``."""
    state = _direct_state()
    if state is None or compiled is None:
        return
    plan_key = (id(owner), len(args), *kwargs)
    plan = _PLANS.get(plan_key, False)
    if plan is False:
        from triton.runtime.jit import JITFunction
        planned = isinstance(kernel, JITFunction) and not any(isinstance(v, torch.Tensor) for v in kwargs.values()) \
            and all(hasattr(compiled, name) for name in ('run', 'function', 'packed_metadata'))
        plan = _PLANS[plan_key] = _Plan(owner, args, kwargs) if planned else None
    if plan is None:  # not a jitted kernel, tensors among the keyword arguments, another compiled kernel: Triton's
        return
    try:
        key = _direct_key(plan, state[0].active.get_current_device(), args, kwargs)
        tail = tuple(launch_kwargs[p.name] if p.name in launch_kwargs else p.default
                     for p in kernel.params[len(args):])
        if len(_DIRECT) >= _DIRECT_MAX:
            del _DIRECT[next(iter(_DIRECT))]
        _DIRECT[key] = compiled, tail, dict(launch_kwargs)
    except (TypeError, AttributeError):  # not as planned, or not hashable: Triton's path for it
        pass


def _run(kernel, grid, args, kwargs):
    """``kernel[grid](*args, **kwargs)`` for a ``triton.jit`` kernel: directly where a launch like it was made
    before, else down Triton's path, remembering the compiled kernel that it launched; returns that kernel."""
    compiled = _direct(kernel, kernel, grid, args, kwargs)
    if compiled is None:
        compiled = kernel[grid](*args, **kwargs)
        _remember(kernel, kernel, args, kwargs, kwargs, compiled)
    return compiled


def tuned_configs(tuner, args, kwargs):
    """The configs of autotuner ``tuner`` that it times for a launch with ``args`` and ``kwargs`` (after
    its pruning)."""
    if tuner.early_config_prune is None:
        return tuner.configs
    return tuner.early_config_prune(tuner.configs, dict(zip(tuner.arg_names, args)), **kwargs)


# where a tunable kernel's default config did not fit the GPU's shared memory: the config that ran instead, by the
# launch's tuning key, other compile-time arguments, default and device (the default fails before any work, but
# only after Triton has looked it up and raised, at every launch, and the configs before the fitting one as well)
_FITTING = {}
_DID_NOT_FIT = set()  # the tunable kernels whose default has not fit (only their launches look up _FITTING)


def _fitting_key(tuner, args, kwargs, default):
    if not hasattr(tuner, 'keys'):  # a Triton whose autotuner does not say what it keys on: nothing remembered
        return None
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    others = tuple((name, v) for name, v in kwargs.items() if not isinstance(v, torch.Tensor))
    return tuner, tuning_key(tuner, args, kwargs), others, tuple(default.items()), device


def _launch_first_fitting(tuner, grid, args, kwargs, default):
    """The default config of autotuner ``tuner``, else the first of its (pruned) configs that fits the
    GPU's shared memory (remembered for the launches like this one)."""
    from triton.runtime.errors import OutOfResources
    key = _fitting_key(tuner, args, kwargs, default) if tuner in _DID_NOT_FIT else None
    fitting = _FITTING.get(key) if key is not None else None
    if fitting is not None:
        _run(tuner.fn, grid, args, {**kwargs, **fitting})
        return
    try:
        _run(tuner.fn, grid, args, {**kwargs, **default})
        return
    except OutOfResources as err:
        failed = err
    _DID_NOT_FIT.add(tuner)
    for config in tuned_configs(tuner, args, kwargs):
        try:
            _run(tuner.fn, grid, args, {**kwargs, **config.all_kwargs()})
        except OutOfResources:
            continue
        if key is None:  # the first launch whose default did not fit: the key not worked out above
            key = _fitting_key(tuner, args, kwargs, default)
        if key is not None:
            _FITTING[key] = config.all_kwargs()
        return
    raise failed


def dry_running():
    """True inside :func:`dry_run` (the ops make their choices as on its GPU)."""
    return bool(_DRY_RUNS)


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


def key_bias_args(bias, k):
    """(pointer, strides) of a key bias (mmpola.ops.dispatch.key_bias_operand) for the kernels that add it where
    they read the keys k: the bias and its strides broadcast to k (0 along the dims it is shared by); without
    one, k (a pointer the kernels do not read: their ``BIAS`` is False) and zeros. The strides are those of
    ``bias.expand(k.shape)``, worked out from the shapes (no operator)."""
    if bias is None:
        return k, (0, ) * k.dim()
    lead = k.dim() - bias.dim()
    strides = [0] * lead if lead > 0 else []
    for size, full, stride in zip(bias.shape, k.shape[lead:], bias.stride()):  # a loop: no generator's calls
        if lead < 0 or (size != full and size != 1):
            raise ValueError(f'a key bias of shape {tuple(bias.shape)} does not broadcast to the keys '
                             f'{tuple(k.shape)}')
        strides.append(0 if size != full else stride)
    return bias, tuple(strides)


def dot_precision(dtype, bd):
    """``tl.dot``'s input precision for a kernel whose tiles are loaded from ``dtype`` inputs and computed in
    float32, at head dim block ``bd``: three TF32 products (about float32's accuracy, on tensor cores) for
    float32 inputs, one TF32 product for float16 / bfloat16 inputs (their values are exact in TF32, so only
    the kernels' own float32 operands, such as a head's summary matrix, are rounded, to finer than the half
    output they make), IEEE for float64 (the interpreter) and for float32 above head dim 64 (the split operands
    of three products would not fit in shared memory)."""
    if dtype == torch.float64 or (dtype == torch.float32 and bd > 64):
        return 'ieee'
    return 'tf32x3' if dtype == torch.float32 else 'tf32'


def cdiv(a, b):
    """``ceil(a / b)`` of two ints, as ``triton.cdiv``, for launch code: Triton's is a constexpr function, whose
    wrapper adds Python calls to each of the launches' host-side steps."""
    return -(-a // b)


def next_power_of_2(n):
    """The smallest power of two >= ``n`` (0 for 0), as ``triton.next_power_of_2``, for launch code."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


if triton_available() is None:
    import triton
    import triton.language as tl

    @triton.jit
    def batch_and_head(bh, H):
        """(batch, head) of the flat index ``bh = batch * H + head`` of a program's head, as int64 (they
        scale offsets into tensors that may pass 2**31 elements)."""
        return (bh // H).to(tl.int64), (bh % H).to(tl.int64)

    @triton.jit
    def sigmoid_parts(x):
        """(sigmoid(x), sigmoid(x) * (1 - sigmoid(x))) without overflow: from e = exp(-|x|)."""
        e = tl.exp(-tl.abs(x))
        inv = 1.0 / (1.0 + e)
        return tl.where(x >= 0, inv, e * inv), e * inv * inv

    @triton.jit
    def softplus(x):
        """log(1 + e^x) = max(x, 0) + log1p(e^-|x|), log1p by Goldberg's rule (a few ulp for every x)."""
        u = tl.exp(-tl.abs(x))
        w = 1.0 + u
        return tl.maximum(x, 0.0) + tl.where(w == 1.0, u, tl.log(w) * (u / tl.where(w == 1.0, 1.0, w - 1.0)))

    @triton.jit
    def add_key_bias(x, bias_ptrs, mask, BIAS: tl.constexpr):
        """Key rows ``x`` (loaded, in the accumulation dtype) with the key bias at ``bias_ptrs`` added (``BIAS``)
        and the sum rounded to the bias's dtype, that of ``k + key_bias`` in torch (the launch code casts the
        bias to it: :func:`mmpola.ops.dispatch.key_bias_operand`); rounded to nearest even, as torch, on a GPU.
        Triton's interpreter truncates to bfloat16 instead (the tests compare within tolerances); rounding by the
        bits, as the LayerNorm kernel does, would cost the attention kernels registers (a spill in Pola's key
        backward at bfloat16 and head dim 64 on sm_90) for the interpreter's sake."""
        if BIAS:
            x += tl.load(bias_ptrs, mask=mask, other=0.0).to(x.dtype)
            if bias_ptrs.dtype.element_ty != x.dtype:
                x = x.to(bias_ptrs.dtype.element_ty, fp_downcast_rounding='rtne').to(x.dtype)
        return x
