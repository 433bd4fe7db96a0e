"""What the Triton implementations share (mmpola.ops.triton_support): which GPUs and inputs they run on
(shared memory per head dim and dtype), when a tunable kernel is timed, and a default config that does
not fit the GPU. The kernels themselves are tested per op (test_<op>_triton.py)."""
import pytest
import torch

from mmpola.ops import OPS, triton_support
from mmpola.ops.dispatch import AttnImplUnavailable
from mmpola.ops.triton_support import (
    KernelTarget,
    autotuning,
    cdiv,
    dot_precision,
    dry_run,
    launch,
    next_power_of_2,
    on_the_tensors_device,
    shared_memory_unsupported,
)
from tests.fixtures.ops import A100, B200, H100, RTX_4090, RTX_5090, kernels_compiled
from tests.fixtures.paths import PYTHON
from tests.fixtures.runs import run_tool

INTERPRETER = triton_support.INTERPRETER
FULL_SHARED_MEMORY = triton_support.FULL_SHARED_MEMORY

pytestmark = pytest.mark.skipif(triton_support.triton_available() is not None, reason='triton is not installed')



@pytest.mark.parametrize('target', [A100, H100, B200, INTERPRETER], ids=['A100', 'H100', 'B200', 'interpreter'])
def test_gpus_the_launch_configs_are_made_for_run_every_head_dim_and_dtype(target):
    assert target.shared_memory == 0 or target.shared_memory >= FULL_SHARED_MEMORY
    for head_dim in (8, 16, 24, 32, 48, 64, 96, 128):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            assert shared_memory_unsupported(target, head_dim, dtype) is None


def test_gpus_with_99_kib_run_what_fits_and_say_why_not_otherwise():
    fits = [(32, torch.float32), (16, torch.float32), (64, torch.bfloat16), (64, torch.float16), (40, torch.float16)]
    for head_dim, dtype in fits:
        assert shared_memory_unsupported(RTX_4090, head_dim, dtype) is None, (head_dim, dtype)
        assert shared_memory_unsupported(RTX_5090, head_dim, dtype) is None, (head_dim, dtype)
    assert shared_memory_unsupported(RTX_5090, 64, torch.float32) == shared_memory_unsupported(
        RTX_4090, 64, torch.float32)
    assert shared_memory_unsupported(RTX_4090, None, torch.float32) is None  # head dim unknown: no verdict
    reason = shared_memory_unsupported(RTX_4090, 64, torch.float32)
    assert reason == ('this GPU gives a block 99 KiB of shared memory, too little for the Triton kernels at head '
                      'dim 64 on float32 inputs (they run float32 inputs up to head dim 32 there); '
                      "use attn_impl='fast'")
    assert '(they run float16 / bfloat16 inputs up to head dim 64 there)' in shared_memory_unsupported(
        RTX_4090, 128, torch.bfloat16)
    assert shared_memory_unsupported(RTX_4090, 48, torch.float32) is not None  # a 64-channel block


@pytest.mark.parametrize('capability, warp_products', [
    ((8, 0), True), ((8, 6), True), ((8, 9), True), ((12, 0), True), ((12, 1), True),
    ((9, 0), False), ((10, 0), False), ((10, 3), False), ((11, 0), False)])
def test_the_targets_whose_tensor_core_products_are_one_warps_each(capability, warp_products):
    """mma.sync on Ampere, Ada and the Blackwell of the RTX 50xx (12.x); warpgroup or tensor-memory products on
    Hopper and the datacenter Blackwell (9.x, 10.x, 11.x): the launch code picks a kernel's form by it."""
    assert KernelTarget(True, capability, 100, 99 * 1024).warp_products is warp_products
    assert INTERPRETER.warp_products is False


def test_half_inputs_are_exact_in_tf32_so_one_tf32_product_rounds_only_the_kernels_own_operands():
    """dot_precision's premise: every float16 / bfloat16 value (all 65536 bit patterns, subnormals, infinities
    and NaNs among them) has at most TF32's 10 fraction bits and its exponent range once cast to float32 (the
    low 13 bits are zero), so a single TF32 product is exact on the loaded tiles; float32 values are not."""
    for dtype in (torch.float16, torch.bfloat16):
        values = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)
        assert values.unique().numel() > 60000 and values.isnan().any() and (values[values != 0].abs() <
                                                                             torch.finfo(dtype).tiny).any()
        assert not (values.float().view(torch.int32) & 0x1FFF).any(), dtype
    assert (torch.randn(4096).view(torch.int32) & 0x1FFF).any()
    assert [dot_precision(dtype, 64) for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)] == \
        ['tf32x3', 'tf32', 'tf32', 'ieee']
    assert [dot_precision(dtype, 128) for dtype in (torch.float32, torch.bfloat16)] == ['ieee', 'tf32']


def _tf32(x):
    """x rounded to TF32 (10 fraction bits, to nearest, ties away from zero, as the GPUs' conversion), as float64."""
    bits = x.float().view(torch.int32)
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32).double()


@pytest.mark.parametrize('dtype, share', [(torch.float16, 1.0), (torch.bfloat16, 0.2)], ids=str)
def test_one_tf32_product_rounds_finer_than_the_half_output(dtype, share):
    """What one TF32 product costs half inputs: with InLine's summary matrix M rounded to TF32 (the only rounded
    operand of ``q M`` and ``g M^T``, q and g being exact), the output and q's gradient move by less than rounding
    them to the inputs' dtype does (float16), a fifth of it (bfloat16); computed in float64 on the CPU."""
    g = torch.Generator().manual_seed(0)
    q, k, v, grad = [torch.randn(2, 143, 64, generator=g).to(dtype).double() for _ in range(4)]
    n, d = k.shape[1], k.shape[2]
    m = (k.transpose(1, 2) @ v / n - k.mean(1)[:, :, None] * v.mean(1)[:, None, :]) * d ** -0.5
    for exact, rounded in ((v.mean(1, keepdim=True) + q @ m, v.mean(1, keepdim=True) + q @ _tf32(m)),
                           (grad @ m.transpose(1, 2), grad @ _tf32(m).transpose(1, 2))):
        largest = exact.abs().max()
        tf32_error = (rounded - exact).abs().max() / largest
        output_rounding = (exact.to(dtype).double() - exact).abs().max() / largest
        assert 0 < tf32_error < share * output_rounding, (tf32_error, output_rounding)


@pytest.mark.parametrize('op_name, option', [('pola', 'PREC'), ('inline', 'PRECISION')])
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_the_attention_kernels_take_their_products_precision_from_one_rule(op_name, option, dtype):
    """Pola's and InLine's kernels load their tiles into float32 and multiply on tensor cores at the precision
    ``dot_precision`` gives for the inputs' dtype and head dim block, on every GPU (a dry run of the forward and
    backward); the interpreter computes every product in IEEE float32 whatever it is asked."""
    op = OPS[op_name]
    for target in (A100, H100, B200):
        for head_dim in (32, 64, 128):
            tensors, options = op.example_inputs(1, 2, (3, 5), head_dim, torch.Generator().manual_seed(0))
            tensors = [t.to(dtype).requires_grad_() if i < 3 else t for i, t in enumerate(tensors)]
            with dry_run(target) as launches:
                out = op.impls['triton'](*tensors, *options)
                torch.autograd.grad(out, tensors[:3], torch.ones_like(out))
            assert len(launches) >= 4, (target, head_dim)
            precisions = {launch.kwargs[option] for launch in launches if option in launch.kwargs}
            assert precisions == {dot_precision(dtype, max(16, next_power_of_2(head_dim)))}, (target, head_dim)


# on a 99 KiB GPU: a float32 head dim each op turns down, and (head dim, dtype) it runs. PaCS's tiles are half the
# head dim wide, so it runs wider heads than the others (its own table, pacs_triton._SMALL_SHARED_MEMORY)
ON_99_KIB = {'pacs': (256, [(128, torch.float32), (128, torch.bfloat16)])}
ON_99_KIB_DEFAULT = (64, [(64, torch.bfloat16), (32, torch.float32)])


@pytest.mark.parametrize('op_name', sorted(name for name, op in OPS.items() if 'triton' in op.impls))
def test_every_op_turns_down_what_does_not_fit_before_any_launch(op_name):
    """On a 99 KiB GPU (dry run: the launch code answers as on that GPU, launches are recorded) every
    op's Triton implementation declines float32 at a head dim whose kernels do not fit there, on entry,
    and runs what fits (the widest float32 and bfloat16 heads its table admits)."""
    op = OPS[op_name]
    declined, runs = ON_99_KIB.get(op_name, ON_99_KIB_DEFAULT)

    def inputs(head_dim, dtype):
        tensors, options = op.example_inputs(1, 2, (3, 5), head_dim, torch.Generator().manual_seed(0))
        return [t.to(dtype) if i < 3 else t for i, t in enumerate(tensors)], options

    with dry_run(RTX_4090) as launches:
        tensors, options = inputs(declined, torch.float32)
        with pytest.raises(AttnImplUnavailable, match=rf"cannot run here: this GPU gives a block 99 KiB .* head dim "
                           rf"{declined} on float32 inputs"):
            op.impls['triton'](*tensors, *options)
        assert not launches
        for head_dim, dtype in runs:
            tensors, options = inputs(head_dim, dtype)
            op.impls['triton'](*tensors, *options)
            assert launches, (head_dim, dtype)
            launches.clear()


def test_the_interpreter_is_decided_when_the_kernels_are_defined(monkeypatch):
    """Triton makes a kernel an interpreted one where TRITON_INTERPRET=1 when the kernel is defined; ``interpreting``
    answers what mmpola's kernels are, whatever the variable says later (it is not read at each launch)."""
    from triton.runtime.interpreter import InterpretedFunction
    interpreted = isinstance(triton_support.batch_and_head, InterpretedFunction)
    assert triton_support.interpreting() is interpreted
    monkeypatch.setenv('TRITON_INTERPRET', '0' if interpreted else '1')
    assert triton_support.interpreting() is interpreted


def test_autotuning_is_off_where_nothing_may_time_and_when_asked(monkeypatch):
    kernels_compiled(monkeypatch)
    monkeypatch.delenv('MMPOLA_TRITON_AUTOTUNE', raising=False)
    assert autotuning()
    for off in ('0', 'false', 'OFF'):
        monkeypatch.setenv('MMPOLA_TRITON_AUTOTUNE', off)
        assert not autotuning()
    monkeypatch.setenv('MMPOLA_TRITON_AUTOTUNE', '1')
    assert autotuning()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert not autotuning()
    finally:
        torch.use_deterministic_algorithms(deterministic)
    kernels_compiled(monkeypatch, False)
    assert not autotuning()


class _Kernel:
    """A jit function's launch interface that fails, as Triton does before launching, for blocks of
    more than ``fits`` rows (too much shared memory)."""

    def __init__(self, fits):
        self.fits, self.calls = fits, []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            from triton.runtime.errors import OutOfResources
            self.calls.append(kwargs['BLOCK'])
            if kwargs['BLOCK'] > self.fits:
                raise OutOfResources(kwargs['BLOCK'] * 1024, self.fits * 1024, 'shared memory')
        return run


class _Tuner:
    """What launch reads of a triton.autotune: the jit function, its configs and their pruning."""

    def __init__(self, fits, prune=None):
        import triton
        self.fn = _Kernel(fits)
        self.configs = [triton.Config({'BLOCK': block}, num_warps=4) for block in (64, 16, 32)]
        self.early_config_prune = prune
        self.arg_names, self.keys = ['x'], []


def test_a_default_config_that_does_not_fit_gives_way_to_the_first_that_does(monkeypatch):
    monkeypatch.setenv('MMPOLA_TRITON_AUTOTUNE', '0')
    tuner = _Tuner(fits=32)
    launch(tuner, (1, ), 'x', default=dict(BLOCK=64, num_warps=8))
    assert tuner.fn.calls == [64, 64, 16]  # the default, the first config (too big), the second
    tuner = _Tuner(fits=32, prune=lambda configs, named_args, **kwargs: configs[2:])
    launch(tuner, (1, ), 'x', default=dict(BLOCK=64, num_warps=8))
    assert tuner.fn.calls == [64, 32]  # only the configs the kernel's pruning keeps
    tuner = _Tuner(fits=8)
    from triton.runtime.errors import OutOfResources
    with pytest.raises(OutOfResources):
        launch(tuner, (1, ), 'x', default=dict(BLOCK=64, num_warps=8))
    assert tuner.fn.calls == [64, 64, 16, 32]


def test_the_config_that_fits_where_the_default_did_not_is_remembered(monkeypatch):
    """A launch like one whose default did not fit runs the config that fitted then, without trying the default and
    the configs before it again (each fails only after Triton has looked it up and raised); another tuning key,
    other compile-time arguments or another default try again; nothing is remembered where the default fits."""
    monkeypatch.setenv('MMPOLA_TRITON_AUTOTUNE', '0')
    monkeypatch.setattr(triton_support, '_FITTING', {})
    monkeypatch.setattr(triton_support, '_DID_NOT_FIT', set())
    x, half = torch.zeros(2), torch.zeros(2, dtype=torch.float16)
    fits = _Tuner(fits=64)
    for _ in range(2):
        launch(fits, (1, ), x, default=dict(BLOCK=64, num_warps=8))
    assert fits.fn.calls == [64, 64] and not triton_support._FITTING
    tuner = _Tuner(fits=32)
    for _ in range(3):
        launch(tuner, (1, ), x, default=dict(BLOCK=64, num_warps=8))
    assert tuner.fn.calls == [64, 64, 16, 16, 16]  # the default, the first config, the second; then the second
    del tuner.fn.calls[:]
    launch(tuner, (1, ), half, default=dict(BLOCK=64, num_warps=8))  # another dtype: another key
    launch(tuner, (1, ), x, FLIP=True, default=dict(BLOCK=64, num_warps=8))  # another compile-time argument
    launch(tuner, (1, ), x, default=dict(BLOCK=32, num_warps=8))  # another default (it fits)
    assert tuner.fn.calls == [64, 64, 16, 64, 64, 16, 32]
    del tuner.fn.calls[:]
    for args, kwargs in (((half, ), {}), ((x, ), dict(FLIP=True))):
        launch(tuner, (1, ), *args, **kwargs, default=dict(BLOCK=64, num_warps=8))
    assert tuner.fn.calls == [16, 16]
    # a benchmark whose launches time nothing leaves nothing of this behind either
    with triton_support.choices_kept():
        launch(_Tuner(fits=16), (1, ), x, default=dict(BLOCK=64, num_warps=8))
    assert len(triton_support._FITTING) == 3 and triton_support._DID_NOT_FIT == {tuner}


class _Autotuner:
    """What launch reads of a triton.autotune that times: its key, argument names, jit function and, after a
    launch through it, the config it chose (the first whose BLOCK is at least the key's ``d``, as its timing
    would pick; ``hook``: the configs' pre-launch hook; ``says_its_choice``: whether it keeps that config in
    ``best_config``)."""

    def __init__(self, hook=None, says_its_choice=True):
        import triton
        self.says_its_choice = says_its_choice
        self.fn = _Kernel(fits=1024)
        self.configs = [triton.Config({'BLOCK': block}, num_warps=4, pre_hook=hook) for block in (16, 32, 64)]
        self.keys, self.arg_names = ['d'], ['x', 'd', 'scale']
        self.tuned = []  # the keys of the launches made through the autotuner

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.tuned.append((args[1], args[0].dtype))
            config = next(c for c in self.configs if c.kwargs['BLOCK'] >= args[1])
            if self.says_its_choice:
                self.best_config = config
            self.fn[grid](*args, **kwargs, **config.all_kwargs())
        return run


def test_a_tuned_launch_goes_through_the_autotuner_once_per_key(monkeypatch):
    """Triton's autotuner computes its key from every argument at each launch, a host cost of the order of the
    launch itself: where it times configs, a launch of a key it has chosen for (the values of its key arguments,
    the tensors' dtypes) goes to the kernel with the chosen config directly, the same config it would run."""
    monkeypatch.setattr(triton_support, 'autotuning', lambda: True)
    tuner = _Autotuner()
    x, half = torch.zeros(2), torch.zeros(2, dtype=torch.float16)
    for args in ((x, 20, 1.0), (x, 20, 2.0), (x, 20, 1.0), (half, 20, 1.0), (x, 40, 1.0), (x, 40, 3.0),
                 (half, 20, 1.0)):
        launch(tuner, (1, ), *args, default=dict(BLOCK=16, num_warps=4))
    # the autotuner chose once per key: d and the tensors' dtypes, not the other scalars
    assert tuner.tuned == [(20, torch.float32), (20, torch.float16), (40, torch.float32)]
    assert tuner.fn.calls == [32, 32, 32, 32, 64, 64, 32]  # each launch with its key's config
    assert triton_support.tuning_key(tuner, (x, 20, 1.0), {}) == (20, torch.float32)
    assert triton_support.tuning_key(tuner, (x, ), dict(d=20, scale=x.half())) == (20, torch.float32, torch.float16)
    # configs with a pre-launch hook (run at each launch by the autotuner) keep its path
    hooked = _Autotuner(hook=lambda args: None)
    for _ in range(3):
        launch(hooked, (1, ), x, 20, 1.0, default=dict(BLOCK=16, num_warps=4))
    assert len(hooked.tuned) == 3
    # an autotuner that does not say what it keys on, or what it chose, is asked at every launch
    for missing in ('keys', 'best_config'):
        silent = _Autotuner(says_its_choice=missing != 'best_config')
        if missing == 'keys':
            del silent.keys
        for _ in range(2):
            launch(silent, (1, ), x, 20, 1.0, default=dict(BLOCK=16, num_warps=4))
        assert len(silent.tuned) == 2 and silent.fn.calls == [32, 32], missing
    # a benchmark whose launches time nothing leaves no choice behind, on disk (Triton's cache of tunings, which
    # later processes would read) or in its log neither
    from triton import knobs
    chosen, real = dict(triton_support._CHOSEN), triton_support._TUNERS[0]
    monkeypatch.setattr(real, 'cache_results', True)
    monkeypatch.setattr(knobs.autotuning, 'print', True)
    with triton_support.choices_kept():
        launch(_Autotuner(), (1, ), x, 20, 1.0, default=dict(BLOCK=16, num_warps=4))
        real.cache[('made-up', )] = real.configs[0]
        assert len(triton_support._CHOSEN) == len(chosen) + 1
        assert not real.cache_results and not knobs.autotuning.print
    assert triton_support._CHOSEN == chosen and ('made-up', ) not in real.cache
    assert real.cache_results and knobs.autotuning.print


def test_kernels_launch_on_their_tensors_device(monkeypatch):
    """Triton launches on the current CUDA device: a launch whose first CUDA tensor is on another device (a model
    on cuda:1 in a process whose current device is 0) makes that device current for the launch."""
    import contextlib
    from types import SimpleNamespace

    entered = []

    @contextlib.contextmanager
    def device(index):
        entered.append(index)
        yield

    monkeypatch.setattr(torch.cuda, 'current_device', lambda: 0)
    monkeypatch.setattr(torch.cuda, 'device', device)

    def on_gpu(index):  # what the guard reads of a CUDA tensor, without a GPU here
        return SimpleNamespace(is_cuda=True, device=torch.device('cuda', index))

    with on_the_tensors_device((torch.zeros(1), 3, None)):  # CPU tensors (the interpreter): nothing changes
        pass
    with on_the_tensors_device((torch.zeros(1), on_gpu(0), on_gpu(1))):  # already current
        pass
    assert entered == []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append(list(entered))

    launched = []
    launch(Kernel(), (1, ), torch.zeros(1), on_gpu(1), on_gpu(0), BLOCK=16)
    assert launched == [[1]] and entered == [1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason='timing configs needs a GPU')
def test_tuned_kernels_agree_with_the_default_config(monkeypatch):
    """On a GPU the suite runs the default configs (tests/conftest.py); here the kernels are tuned."""
    from mmpola.ops import pola_attention_triton
    from tests.fixtures.ops import forward_backward, relative_error
    op = OPS['pola']
    tensors, options = op.example_inputs(2, 2, (21, 37), 32, torch.Generator().manual_seed(0))
    tensors = [t.cuda() for t in tensors]
    grad_out = torch.randn(tensors[0].shape, generator=torch.Generator().manual_seed(1)).cuda()
    monkeypatch.setenv('MMPOLA_TRITON_AUTOTUNE', '0')
    fixed = forward_backward(pola_attention_triton, tensors, grad_out, *options)
    monkeypatch.setenv('MMPOLA_TRITON_AUTOTUNE', '1')
    tuned = forward_backward(pola_attention_triton, tensors, grad_out, *options)
    for a, e in zip(tuned, fixed):
        assert relative_error(a, e) <= 1e-5


def test_launch_arithmetic_is_tritons():
    triton = pytest.importorskip('triton')
    for a in range(0, 300):
        assert next_power_of_2(a) == triton.next_power_of_2(a)
        assert all(cdiv(a, b) == triton.cdiv(a, b) for b in (1, 2, 3, 7, 16, 64, 299))
    assert next_power_of_2(2**40 + 1) == 2**41 and cdiv(2**40 + 1, 2**20) == 2**20 + 1


def test_key_bias_strides_are_those_of_the_bias_expanded_to_the_keys():
    """The kernels read a key bias with the strides that ``bias.expand(k.shape)`` has (0 along the dims it is shared
    by), worked out from the shapes; a bias that does not broadcast to the keys is one clear error."""
    k = torch.zeros(2, 3, 5, 4)
    for shape in [(1, 3, 5, 4), (2, 3, 5, 4), (1, 1, 5, 4), (3, 5, 4), (5, 4), (1, 3, 1, 4), (2, 1, 5, 1)]:
        bias = torch.zeros(shape)
        for layout in (bias, bias.transpose(-1, -2).contiguous().transpose(-1, -2)):
            assert triton_support.key_bias_args(layout, k) == (layout, layout.expand(k.shape).stride()), shape
    one = torch.zeros(1, 3, 5, 4)
    view = torch.zeros(1, 20, 12).as_strided((1, 3, 5, 4), (240, 4, 12, 1))
    assert triton_support.key_bias_args(view, one)[1] == view.expand(one.shape).stride()
    assert triton_support.key_bias_args(None, k) == (k, (0, 0, 0, 0))
    for shape in [(3, 3, 5, 4), (1, 2, 3, 5, 4), (1, 3, 5, 2)]:
        with pytest.raises(ValueError, match='does not broadcast to the keys'):
            triton_support.key_bias_args(torch.zeros(shape), k)


# A training step's Triton launches (Pola-PVT-T's narrowed layout, bf16, recorded in a dry run for an H100) and a
# small kernel's, made down Triton's own launch path and directly (mmpola.ops.triton_support, "Direct launches")
# to a driver that stands in for an H100's with a launcher that records each call it gets instead of launching
# (tools/benchmark_host.py, stand_in_driver): prints what the checks found
DIRECT_LAUNCHES = """
import sys
sys.path[:0] = ['tools']
import torch
import triton
import triton.language as tl
from triton import knobs
from triton.runtime import driver
import benchmark
import benchmark_host as host
from mmpola.ops import triton_support as ts

calls = []


class Recording:
    def __init__(self, src, metadata):
        pass

    def __call__(self, *args):
        calls.append((self, args))


def made(launch):  # the launcher's call of one launch
    del calls[:]
    launch()
    assert len(calls) == 1, len(calls)
    return calls[0]


def direct(call):  # a direct launch passes no hooks nor their metadata; Triton's path passes its hook chains
    return call[1][6:9] == (None, None, None)


def same(a, b):  # the same compiled kernel, grid, stream, function, metadata and arguments
    (launcher_a, args_a), (launcher_b, args_b) = a, b
    return launcher_a is launcher_b and args_a[:6] == args_b[:6] and len(args_a) == len(args_b) and all(
        x is y if isinstance(x, torch.Tensor) else (type(x) is type(y) and x == y)
        for x, y in zip(args_a[9:], args_b[9:]))


def triton_path(launch):
    ts._ON[:] = [None]
    try:
        return made(launch)
    finally:
        del ts._ON[:]


@triton.jit
def copy(x, y, n, stride, scale, BLOCK: tl.constexpr, SHIFT: tl.constexpr = 0):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y + offsets * stride + SHIFT, tl.load(x + offsets * stride, mask=mask) * scale, mask=mask)


step = benchmark.backbone_pass(host.build_narrowed(*benchmark.all_backbones()['pola-pvt-t']), torch.randn(1, 3, 64, 96),
                               backward=True, amp='bfloat16')
with host.h100_dry_run() as launches:
    step()
    del launches[:]
    step()
    recorded = list(launches)
with host.stand_in_driver(), host.h100_dry_run():
    driver.active.launcher_cls = Recording
    print('VERSION', '.'.join(triton.__version__.split('.')[:2]) in ts.DIRECT_TRITON)
    theirs = [triton_path(lambda: ts.relaunch(r)) for r in recorded]
    first = [made(lambda: ts.relaunch(r)) for r in recorded]
    ours = [made(lambda: ts.relaunch(r)) for r in recorded]
    print('STEP', len(recorded), sum(map(direct, theirs)), sum(map(direct, first)), sum(map(direct, ours)),
          sum(map(same, theirs, ours)))
    # pointers at every address modulo 16 (float32 and float16 elements), ints 1, multiples of 16 and others
    base, hits = torch.empty(4096, dtype=torch.float32), 0
    for dtype, step_bytes in ((torch.float32, 4), (torch.float16, 2)):
        storage = base.view(dtype)
        for offset in list(range(0, 64, step_bytes)) * 2:
            x = storage[offset // step_bytes:]
            for n, stride in ((48, 1), (17, 1), (32, 16), (33, 2)):
                launch = lambda: ts._run(copy, (2, ), (x, storage, n, stride, 1.5), dict(BLOCK=32, num_warps=4))
                theirs, ours = triton_path(launch), made(launch)
                hits += direct(ours)
                if not same(theirs, ours):
                    print('DIFFERENT', dtype, offset, n, stride)
    print('POINTERS', sum(1 for key in ts._DIRECT if key[0].owner is copy), hits)
    # a launch hook, a pre-run hook and other types: Triton's path
    launch = lambda: ts._run(copy, (2, ), (base, base, 48, 1, 1.5), dict(BLOCK=32, num_warps=4))
    print('HIT', direct(made(launch)), direct(made(lambda: ts._run(copy, (2, ), (base, base, 48, 1, 2), dict(
        BLOCK=32, num_warps=4)))))
    seen = []
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        print('HOOKED', direct(made(launch)))
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    copy.add_pre_run_hook(lambda *args, **kwargs: seen.append('pre-run'))
    print('PRE-RUN', direct(made(launch)), seen.count('pre-run'))
    copy.pre_run_hooks.clear()
    print('AFTER', direct(made(launch)))
"""


def test_direct_launches_call_the_launcher_as_triton_s_path_does(tmp_path):
    """A launch like one made before goes to the launcher of the kernel Triton's path chose for it, with the same
    call but for the hooks' metadata: the same compiled kernel, grid, stream and arguments, for every launch of a
    training step, and for pointers at every address modulo 16 (Triton specialises a pointer on its 16-byte
    alignment) with ints that Triton specialises apart (1, multiples of 16, others). The installed Triton is one
    that the direct launches were made for; a launch hook or a pre-run hook takes Triton's path, as does a launch
    whose arguments' types are not the first launch's."""
    script = tmp_path / 'direct_launches.py'  # Triton compiles kernels of files only
    script.write_text(DIRECT_LAUNCHES)
    log = run_tool([PYTHON, str(script)], env=dict(TRITON_CACHE_DIR=str(tmp_path / 'cache'), TRITON_INTERPRET='0'))
    lines = dict(line.split(' ', 1) for line in log.splitlines() if line.split(' ', 1)[0].isupper())
    assert lines['VERSION'] == 'True', log
    launches, *counts = map(int, lines['STEP'].split())
    # none direct down Triton's path; at the first pass the launches that repeat one of the step's; then every launch,
    # each the same call as Triton's path made
    assert launches > 20 and counts[0] == 0 and 0 < counts[1] < launches and counts[2:] == [launches] * 2, log
    assert 'DIFFERENT' not in lines, log
    # keyed apart at each address modulo 16 (4 of float32 elements, 8 of float16) with each n and stride, once
    assert lines['POINTERS'].split() == [str((4 + 8) * 4), str((16 + 32) * 2 * 4 - (4 + 8) * 4)], log
    assert lines['HIT'] == 'True False', log  # a float where an int was: Triton's path
    assert lines['HOOKED'] == 'False' and lines['PRE-RUN'] == 'False 1' and lines['AFTER'] == 'True', log


def test_the_suite_stops_in_one_line_where_the_interpreter_cannot_run_the_kernels():
    """Triton 3.6's interpreter turns one-element arrays into loop bounds with int(), which numpy 2.4 refuses;
    tests/conftest.py stops the session with this line where the two meet (Triton 3.7 converts the element)."""
    from tests.fixtures.interpreter import interpreter_problem
    assert interpreter_problem('1.26.4', '3.6.0') == interpreter_problem('2.3.5', '3.6.0') == ''
    assert interpreter_problem('2.4.6', '3.7.1') == interpreter_problem('2.5.0', '3.8.0+git1ab2') == ''
    problem = interpreter_problem('2.4.6', '3.6.0')
    assert problem.startswith("Triton 3.6.0's CPU interpreter (TRITON_INTERPRET=1) cannot run the kernels with "
                              'numpy 2.4.6')
    assert problem.endswith('Install numpy < 2.4 (as requirements/pins.txt and requirements/compat.txt pin it) '
                            'or Triton >= 3.7')
