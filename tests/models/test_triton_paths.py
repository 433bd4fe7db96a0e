"""Whole models on each Triton path against the library's path: the depthwise convolutions
(MMPOLA_DEPTHWISE_CONV=triton), the linear layers that recompute their input (MMPOLA_RECOMPUTE=triton: the
MLPs' fc1 with its LayerNorm and fc2, the gated attentions' proj; =elementwise: fc2 and proj only, with the
attention's fast path here), and all of them at once with the attention's kernels (what ``'auto'`` runs on a GPU,
with the recomputing layers that ``MMPOLA_RECOMPUTE=triton`` or ``elementwise`` adds; with ``elementwise`` the
attention's kernels multiply by the gates): outputs, gradients and the gradients' strides, in float32 and under
bf16 autocast.

On a GPU (`make test-gpu`) both paths run there, compiled, with TF32 off; without one the Triton paths run
through Triton's interpreter on the CPU."""
import pytest
import torch

from tests.fixtures.backbones import build_family_model, hooks_training_step
from tests.fixtures.ops import H100, DispatchedOps, compile_time_arguments, relative_error

# the families whose models run Triton kernels (InLine: its value conv once per image)
FAMILIES = ['PolaPVT', 'PolaSwin', 'PolaPP', 'FLattenPVTv2', 'PVTv2-softmax', 'InLinePVT', 'FLattenCSWin']
DEVICE = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
LIBRARY = {'MMPOLA_DEPTHWISE_CONV': 'torch', 'MMPOLA_RECOMPUTE': 'torch'}
# each case: the variables set, with their values, and the attention's implementation
TRITON_PATHS = {'MMPOLA_DEPTHWISE_CONV': ({'MMPOLA_DEPTHWISE_CONV': 'triton'}, 'fast'),
                'MMPOLA_RECOMPUTE': ({'MMPOLA_RECOMPUTE': 'triton'}, 'fast'),
                'MMPOLA_RECOMPUTE=elementwise': ({'MMPOLA_RECOMPUTE': 'elementwise'}, 'fast'),
                'all': (dict.fromkeys(LIBRARY, 'triton'), 'triton'),
                'all, elementwise': ({'MMPOLA_DEPTHWISE_CONV': 'triton', 'MMPOLA_RECOMPUTE': 'elementwise'}, 'triton')}


@pytest.fixture
def no_tf32():
    """The library's float32 convolutions and products in float32 on a GPU (cuDNN's default is TF32)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _run(name, attn_impl='fast', amp=None):
    torch.manual_seed(0)
    model = build_family_model(name).to(DEVICE).train()
    model.set_attn_impl(attn_impl)
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    with torch.autocast(DEVICE.type, amp, enabled=amp is not None):
        outs = model(x)
    g = torch.Generator().manual_seed(2)  # a random projection: the outputs' normalised squares are constant
    sum((o.float() * torch.randn(o.shape, generator=g).to(DEVICE)).mean() for o in outs).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return [o.detach().float() for o in outs], grads, model


def _gradient_errors(actual, expected):
    """Each gradient's max error relative to its largest value, or to a hundredth of the model's largest
    gradient for the gradients that are zero up to rounding (the biases of convolutions followed by a
    normalisation)."""
    assert set(actual) == set(expected)
    floor = 1e-2 * max(g.abs().max().item() for g in expected.values())
    return {n: (actual[n].double() - g.double()).abs().max().item() / max(g.abs().max().item(), floor)
            for n, g in expected.items()}


@pytest.mark.parametrize('paths', list(TRITON_PATHS))
@pytest.mark.parametrize('name', FAMILIES)
def test_triton_paths(name, paths, monkeypatch, no_tf32):
    """The Triton depthwise convolution, or the linear layers that recompute their input (the MLPs' fc1 with
    its LayerNorm and fc2, the gated attentions' proj; or only fc2 and proj, after an element-wise op), or all of
    them with the attention's kernels, against the library's path: outputs, gradients, and the gradients'
    strides."""
    variables, attn_impl = TRITON_PATHS[paths]
    for variable, impl in LIBRARY.items():
        monkeypatch.setenv(variable, impl)
    outs, grads, _ = _run(name)
    for variable, impl in variables.items():
        monkeypatch.setenv(variable, impl)
    triton_outs, triton_grads, model = _run(name, attn_impl)
    for a, e in zip(triton_outs, outs):
        assert relative_error(a, e) <= 1e-5
    errors = _gradient_errors(triton_grads, grads)
    assert max(errors.values()) <= 1e-4, max(errors.items(), key=lambda item: item[1])
    params = dict(model.named_parameters())
    assert {n for n, g in triton_grads.items() if g.stride() != params[n].stride()} == set()


@pytest.mark.parametrize('name', FAMILIES)
def test_triton_paths_under_bf16_autocast(name, monkeypatch, no_tf32):
    """Every Triton path at once under bf16 autocast (a detector's ``--amp`` on a GPU that has bf16) stays
    as close to the float32 model as the library's path does under the same autocast."""
    for variable, impl in LIBRARY.items():
        monkeypatch.setenv(variable, impl)
    outs, grads, _ = _run(name)
    library = _run(name, amp=torch.bfloat16)
    for variable in LIBRARY:
        monkeypatch.setenv(variable, 'triton')
    triton = _run(name, 'triton', amp=torch.bfloat16)
    for kind, (amp_outs, amp_grads, _) in (('library', library), ('triton', triton)):
        assert all(torch.isfinite(o).all() for o in amp_outs), kind
        assert all(torch.isfinite(g).all() for g in amp_grads.values()), kind
    library_out = max(relative_error(a, e) for a, e in zip(library[0], outs))
    triton_out = max(relative_error(a, e) for a, e in zip(triton[0], outs))
    assert triton_out <= max(2 * library_out, 1e-2), (triton_out, library_out)
    library_grad = max(_gradient_errors(library[1], grads).values())
    triton_grad = max(_gradient_errors(triton[1], grads).values())
    assert triton_grad <= max(2 * library_grad, 5e-2), (triton_grad, library_grad)


@pytest.mark.parametrize('name', FAMILIES)
def test_triton_paths_in_inference(name, monkeypatch, no_tf32):
    """Every Triton path at once in eval mode without autograd (inference, a detector's evaluation), where the
    LayerNorms before linear layers still run their kernel: the library's outputs."""
    outputs = []
    for impl, attn_impl in (('torch', 'fast'), ('triton', 'triton')):
        for variable in LIBRARY:
            monkeypatch.setenv(variable, impl)
        torch.manual_seed(0)
        model = build_family_model(name).to(DEVICE).eval()
        model.set_attn_impl(attn_impl)
        with torch.no_grad():
            outputs.append(model(torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(1)).to(DEVICE)))
    for a, e in zip(*outputs):
        assert relative_error(a, e) <= 1e-5



@pytest.mark.parametrize('name', FAMILIES)
def test_new_input_sizes_compile_no_new_triton_kernels(name, monkeypatch):
    """A detector's or segmentor's input size changes from one iteration to the next: a training step's Triton
    launches at new sizes (every kernel: the attention's, the depthwise convolutions', the LayerNorms' and the
    recomputing layers') take the compile-time arguments of the first size's launches, so that Triton compiles
    no kernel for them beyond what its integer arguments' divisibility by 16 adds to a kernel's key (a bound,
    whatever the sizes). Counted in a dry run for an H100, under bf16 autocast and in float32."""
    from mmpola.ops.triton_support import dry_run
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'triton')
    torch.manual_seed(0)
    model = build_family_model(name).train()
    model.set_attn_impl('triton')
    for amp in (torch.bfloat16, None):
        compiled = []
        for h, w in ((64, 96), (72, 104), (96, 64), (104, 136)):
            with dry_run(H100) as launches, torch.autocast('cpu', amp, enabled=amp is not None):
                outs = model(torch.randn(1, 3, h, w))
                sum(o.float().mean() for o in outs).backward()
            compiled.append({compile_time_arguments(launch) for launch in launches})
        assert compiled[0], 'no Triton launch'
        for (h, w), kernels in zip(((72, 104), (96, 64), (104, 136)), compiled[1:]):
            assert kernels <= compiled[0], ((h, w), kernels - compiled[0])

@pytest.mark.parametrize('training', [True, False], ids=['train', 'eval'])
def test_pvt_stages_hand_the_next_their_input_in_the_autocast_dtype(training, monkeypatch):
    """Under bf16 autocast with MMPOLA_RECOMPUTE=triton each PVT stage but the last ends with one kernel that
    writes the blocks' output, in the layout of the stage's output map, and its bfloat16 copy, which the next
    stage's patch embedding convolves (autocast would cast the output to it): the outputs and gradients of the
    stages handing over the float32 output, bit for bit (with stochastic depth in training: the same factors),
    and in a dry run for a GPU without the output's cast and its copy to the map (3 casts and 3 copies fewer in
    the forward; in the backward, without the casts of the copy's and the MLP's gradients and the copy of the
    map's gradient to tokens: 6 casts and 3 copies fewer)."""
    import mmpola.models
    import mmpola.ops.recompute as recompute
    from mmpola.models.backbones.pvt import PVTBackbone
    from mmpola.ops.triton_support import dry_run
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'triton')
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'torch')
    calls = []
    kernel = recompute.residual_cast
    monkeypatch.setattr(recompute, 'residual_cast', lambda *args: calls.append(args[0].shape) or kernel(*args))
    torch.manual_seed(0)
    model = mmpola.models.PolaPVT(arch=dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 2, 4], depths=[2, 1, 1, 1],
                                            mlp_ratios=[2, 2, 2, 2]), drop_path_rate=0.3).to(DEVICE).train(training)
    x = torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    handing = PVTBackbone._handoff_dtype

    def run(handoff):
        monkeypatch.setattr(PVTBackbone, '_handoff_dtype', handing if handoff else lambda self, i, x: None)
        model.zero_grad()
        torch.manual_seed(2)
        with torch.set_grad_enabled(training), torch.autocast(DEVICE.type, torch.bfloat16):
            outs = model(x)
        assert all(o.is_contiguous() and o.dtype == torch.float32 for o in outs)
        if training:
            sum(o.float().square().mean() for o in outs).backward()
        return [o.detach() for o in outs] + [p.grad for p in model.parameters() if p.grad is not None]

    results = [run(True)]
    assert [shape[1:] for shape in calls] == [(16 * 24, 16), (8 * 12, 32), (4 * 6, 48)], calls
    results.append(run(False))
    assert len(results[0]) == len(results[1]) and len(results[0]) > 4 * training
    for a, e in zip(*results):
        assert a.dtype == e.dtype and torch.equal(a, e)
    counts = []
    for handoff in (True, False):
        with dry_run(H100), DispatchedOps() as ops:
            run(handoff)
        counts.append([ops.kernels().count(op) for op in ('_to_copy', 'clone')])
    assert [b - a for a, b in zip(*counts)] == ([9, 6] if training else [3, 3]), counts


def _tensors_of(value):
    """The tensors in a module's output (a tensor, or a tuple of tensors and sizes)."""
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for item in value for t in _tensors_of(item)] if isinstance(value, (tuple, list)) else []


@pytest.mark.parametrize('name', ['PolaPVT', 'FLattenPVTv2', 'FLattenCSWin'])
def test_forward_hooks_see_each_modules_usual_tensors(name, monkeypatch, no_tf32):
    """With every Triton path on (the fused LayerNorm, GELU, gate, residual and depthwise kernels, which take the
    norms', linear layers' and convolutions' weights instead of calling them), forward hooks on any module still
    run, and see what the module gives when called alone: a module with a hook is called as it is (an attention
    or MLP on the normalised tokens, returning its output alone). The outputs equal the model's without hooks."""
    for variable in LIBRARY:
        monkeypatch.setenv(variable, 'triton')
    torch.manual_seed(0)
    model = build_family_model(name).to(DEVICE).eval()
    model.set_attn_impl('triton')
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    with torch.no_grad():
        expected = model(x)
    calls = []
    handles = [module.register_forward_hook(
        lambda module, args, kwargs, out: calls.append((module, args, kwargs, out)), with_kwargs=True)
        for module in model.modules() if module is not model]
    try:
        with torch.no_grad():
            outs = model(x)
    finally:
        for handle in handles:
            handle.remove()
    for a, e in zip(outs, expected):
        assert relative_error(a, e) <= 1e-5
    called = {id(module) for module, *_ in calls}
    uncalled = [n for n, m in model.named_modules()
                if m is not model and list(m.parameters(recurse=False)) and id(m) not in called]
    assert not uncalled, f'modules with weights whose hooks did not run: {uncalled}'
    with torch.no_grad():
        for module, args, kwargs, out in calls:
            again = module(*args, **kwargs)
            assert len(_tensors_of(again)) == len(_tensors_of(out)), type(module).__name__
            for a, e in zip(_tensors_of(out), _tensors_of(again)):
                assert a.shape == e.shape and relative_error(a, e) <= 1e-5, type(module).__name__


@pytest.mark.filterwarnings('ignore:Full backward hook is firing')  # the first convolution: its input is the image
def test_backward_hooks_run_on_the_fused_paths(monkeypatch, no_tf32):
    """Full backward hooks on every module with weights of a PolaPVT in training, every Triton path on: each runs
    (its module is called as it is), and the parameters' gradients equal the model's without hooks (the same
    drop-path factors: drawn as the modules draw them)."""
    for variable in LIBRARY:
        monkeypatch.setenv(variable, 'triton')
    torch.manual_seed(0)
    model = build_family_model('PolaPVT').to(DEVICE).train()
    model.set_attn_impl('triton')
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(1)).to(DEVICE)

    _, expected = hooks_training_step(model, x)
    weighted = {n: m for n, m in model.named_modules() if m is not model and list(m.parameters(recurse=False))}
    ran = set()
    for name, module in weighted.items():
        module.register_full_backward_hook(lambda module, grad_in, grad_out, name=name: ran.add(name))
    errors = _gradient_errors(hooks_training_step(model, x)[1], expected)
    assert set(weighted) - ran == set()
    assert max(errors.values()) <= 1e-5, max(errors.items(), key=lambda item: item[1])
