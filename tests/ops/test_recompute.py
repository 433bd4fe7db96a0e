"""The linear layers whose input the backward recomputes (mmpola.ops.recompute): the MLPs' GELU and fc2
(gelu_linear), Pola's gated output projection (gated_linear) and a LayerNorm with the linear layer after it
(layer_norm_linear; with a residual connection before it, add_layer_norm_linear; with the output taken apart
into the attention's operands, their gradients in one kernel), a stage's last residual connection written
with its copy in another dtype (add_residual_and_cast), and a patch embedding's LayerNorm with the positional
encoding added (layer_norm_add). Their Triton backward against the library's layers in
float64 (output and every gradient), half precision, autocast, strided gates, what the backward keeps, its
kernels, the choice of implementation and the modules that use them (blocks, blocks handing their residual
connection to the next through run_blocks, and the last one to the sum and its copy). Without a GPU the kernels
run through Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1)."""
import contextlib

import pytest
import torch
import torch.nn.functional as F

from mmpola.models.backbones.pvt_v2 import ConvMlp
from mmpola.models.layers import Mlp, PatchEmbed, PatchMerging, PreNormBlock
from mmpola.ops import (
    add_layer_norm_linear,
    add_residual_and_cast,
    gated_linear,
    gelu_linear,
    layer_norm_add,
    layer_norm_linear,
)
from mmpola.ops.dispatch import AttnImplUnavailable
from mmpola.ops.recompute import resolve_recompute_impl
from mmpola.ops.triton_support import dry_run
from tests.fixtures.ops import (
    H100,
    DispatchedOps,
    autograd_node_names,
    forward_backward,
    kernels_compiled,
    max_scaled_error,
    relative_error,
    saved_for_backward,
)

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'


def make_inputs(shape, out_features, dtype=torch.float32, seed=0):
    """h (..., hidden), weight (out, hidden), bias, dL/dout."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*shape, generator=g) * 2
    weight = torch.randn(out_features, shape[-1], generator=g) / shape[-1] ** 0.5
    bias = torch.randn(out_features, generator=g)
    grad = torch.randn(*shape[:-1], out_features, generator=g)
    return [t.to(device=DEVICE, dtype=dtype) for t in (h, weight, bias, grad)]


def library(h, weight, bias=None):
    return F.linear(F.gelu(h), weight, bias)


def triton_path(h, weight, bias=None):
    return gelu_linear(h, weight, bias, impl='triton')


# token blocks (B, N, hidden) and rows (M, hidden); element counts on either side of the kernel's block
SHAPES = [(2, 7, 40), (3, 5, 130), (1, 1, 8), (4, 2049), (2, 33, 96)]


@pytest.mark.parametrize('shape', SHAPES, ids=lambda s: 'x'.join(map(str, s)))
def test_triton_matches_the_library(shape):
    """fp32 within 1e-6 (relative to the largest value) of the float64 library layers: output and the
    gradients of h, weight and bias; the gradients in the inputs' dtypes and shapes."""
    h, weight, bias, grad = make_inputs(shape, 24)
    actual = forward_backward(triton_path, [h, weight, bias], grad)
    expected = forward_backward(library, [h.double(), weight.double(), bias.double()], grad.double())
    for name, a, e in zip(('out', 'dh', 'dweight', 'dbias'), actual, expected):
        assert a.dtype == torch.float32 and a.shape == e.shape, name
        assert relative_error(a, e) <= 1e-6, f'{shape} {name}: {relative_error(a, e):.2e}'


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision(dtype):
    """float16 / bfloat16 operands: the library's own path in that dtype is the yardstick (both round the
    GELU's output and the products to the dtype)."""
    h, weight, bias, grad = make_inputs((2, 9, 64), 32, dtype)
    actual = forward_backward(triton_path, [h, weight, bias], grad)
    expected = forward_backward(library, [h.double(), weight.double(), bias.double()], grad.double())
    own = forward_backward(library, [h, weight, bias], grad)
    for name, a, e, o in zip(('out', 'dh', 'dweight', 'dbias'), actual, expected, own):
        assert a.dtype == dtype, name
        assert relative_error(a, e) <= 2 * relative_error(o, e) + 1e-3, name


def test_autocast_runs_the_linear_layer_in_the_autocast_dtype():
    """Under autocast the layer computes in the autocast dtype as F.linear does, the GELU in h's dtype; the
    parameters' gradients come back in their own dtype (float32)."""
    h, weight, bias, grad = make_inputs((2, 9, 64), 32)
    results = []
    for fn in (triton_path, library):
        leaves = [t.clone().requires_grad_() for t in (h, weight, bias)]
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            out = fn(*leaves)
        out.backward(grad.to(out.dtype))
        results.append([out] + [t.grad for t in leaves])
    for name, a, e in zip(('out', 'dh', 'dweight', 'dbias'), *results):
        assert a.dtype == e.dtype, name
        assert relative_error(a, e) <= 1e-2, name  # a bfloat16 ulp of the largest value at most
    assert results[0][0].dtype == torch.bfloat16 and results[0][2].dtype == torch.float32


def test_only_some_gradients():
    """Without a bias, with h frozen (the weight gradient recomputes the GELU alone), or with the layer frozen."""
    h, weight, bias, grad = make_inputs((3, 20), 8)
    expected = forward_backward(library, [h.double(), weight.double()], grad.double())
    actual = forward_backward(triton_path, [h, weight], grad)
    assert all(relative_error(a, e) <= 1e-6 for a, e in zip(actual, expected))
    w = weight.clone().requires_grad_()
    triton_path(h, w, bias).backward(grad)
    assert relative_error(w.grad, expected[2]) <= 1e-6
    x = h.clone().requires_grad_()
    triton_path(x, weight, bias).backward(grad)
    assert relative_error(x.grad, expected[1]) <= 1e-6


def library_with_input_bias(h, weight, bias, input_bias):
    return F.linear(F.gelu(h + input_bias), weight, bias)


def triton_with_input_bias(h, weight, bias, input_bias):
    return gelu_linear(h, weight, bias, impl='triton', input_bias=input_bias)


def make_input_bias(hidden, dtype=torch.float32, seed=1):
    return torch.randn(hidden, generator=torch.Generator().manual_seed(seed)).to(device=DEVICE, dtype=dtype)


@pytest.mark.parametrize('shape', SHAPES + [(3000, 40)], ids=lambda s: 'x'.join(map(str, s)))
def test_input_bias_matches_the_library(shape):
    """The bias of the layer before the GELU (input_bias): fp32 within 1e-6 of the float64 library layers
    (``F.gelu(h + b)``), its gradient in its dtype and shape; 3000 rows give several programs per column block,
    each with its own partial sums of the bias's gradient."""
    h, weight, bias, grad = make_inputs(shape, 24)
    leaves = [h, weight, bias, make_input_bias(shape[-1])]
    actual = forward_backward(triton_with_input_bias, leaves, grad)
    expected = forward_backward(library_with_input_bias, [t.double() for t in leaves], grad.double())
    for name, a, e in zip(('out', 'dh', 'dweight', 'dbias', 'dinput_bias'), actual, expected):
        assert a.dtype == torch.float32 and a.shape == e.shape, name
        assert relative_error(a, e) <= 1e-6, f'{shape} {name}: {relative_error(a, e):.2e}'
    again = forward_backward(triton_with_input_bias, leaves, grad)
    assert torch.equal(again[-1], actual[-1])  # the same programs and order of the sums


def test_input_bias_under_autocast_and_frozen():
    """Under autocast the float32 input bias is added in float32 (not cast) and its gradient comes back in
    float32; a frozen bias gets none, and the other gradients do not change; a frozen h with a trained bias."""
    h, weight, bias, grad = make_inputs((2, 9, 64), 32)
    b1 = make_input_bias(64)
    results = []
    for fn in (triton_with_input_bias, library_with_input_bias):
        leaves = [t.clone().requires_grad_() for t in (h, weight, bias, b1)]
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            out = fn(*leaves)
        out.backward(grad.to(out.dtype))
        results.append([out] + [t.grad for t in leaves])
    for name, a, e in zip(('out', 'dh', 'dweight', 'dbias', 'dinput_bias'), *results):
        assert a.dtype == e.dtype and relative_error(a, e) <= 1e-2, name
    assert results[0][0].dtype == torch.bfloat16 and results[0][4].dtype == torch.float32
    expected = forward_backward(library_with_input_bias, [t.double() for t in (h, weight, bias, b1)], grad.double())
    leaves = [t.clone().requires_grad_(i != 3) for i, t in enumerate((h, weight, bias, b1))]
    triton_with_input_bias(*leaves).backward(grad)
    assert leaves[3].grad is None
    assert all(relative_error(t.grad, e) <= 1e-6 for t, e in zip(leaves[:3], expected[1:4]))
    leaves = [t.clone().requires_grad_(i == 3) for i, t in enumerate((h, weight, bias, b1))]
    triton_with_input_bias(*leaves).backward(grad)
    assert relative_error(leaves[3].grad, expected[4]) <= 1e-6
    with pytest.raises(ValueError, match=r'gelu_linear expects an input bias of shape \(64,\) for h of 64 channels, '
                       r'got \(32,\)'):
        gelu_linear(h, weight, bias, input_bias=bias)


def test_input_bias_sums_its_gradient_in_the_gelus_kernel():
    """In a dry run for a GPU, against the library's fc1 (with its bias) and GELU: the forward runs the GELU's
    kernel in place of the library's GELU and adds the bias there (no bias in the product, no cast of it under
    autocast); the backward sums no (rows, hidden) gradient (the kernel's partial sums, one sum of them, in place
    of the linear layer's sum of the rows), runs the kernel in place of autograd's GELU backward and casts no
    gradient of the bias: two library kernels fewer each way."""
    h, weight, bias, grad = make_inputs((2, 64, 96), 24)
    x = torch.randn(2, 64, 32, device=DEVICE)
    fc1 = torch.randn(96, 32, device=DEVICE)
    b1 = make_input_bias(96)
    counts = {}
    for impl in ('torch', 'triton'):
        leaves = [t.clone().requires_grad_() for t in (fc1, b1, weight, bias)]
        with dry_run(H100) as launches, torch.autocast(DEVICE, dtype=torch.bfloat16):
            with DispatchedOps() as forward:
                if impl == 'torch':
                    out = gelu_linear(F.linear(x, leaves[0], leaves[1]), *leaves[2:], impl='torch')
                else:
                    out = gelu_linear(F.linear(x, leaves[0]), *leaves[2:], impl='triton', input_bias=leaves[1])
            forward_launches = len(launches)
            with DispatchedOps() as backward:
                out.backward(grad.to(out.dtype))
        wide_sums = [shape for name, shape in zip(backward.names, backward.shapes)
                     if name == 'sum' and shape is not None and shape.numel() >= 2 * 64 * 96]
        counts[impl] = (len(forward.kernels()), len(backward.kernels()), forward_launches,
                        len(launches) - forward_launches, 'gelu' in forward.names, len(wide_sums))
        assert leaves[1].grad.dtype == torch.float32
    assert counts['torch'][2:] == (0, 0, True, 1), counts
    assert counts['triton'][2:] == (1, 1, False, 0), counts
    # the forward: the GELU's kernel for the library's GELU, and no cast of the bias
    assert counts['triton'][0] == counts['torch'][0] - 2, counts
    assert counts['triton'][1] == counts['torch'][1] - 2, counts


def saved_bytes(fn, *tensors):
    return saved_for_backward(fn, *tensors)[1]


def test_the_backward_keeps_the_gelus_input_only():
    """What autograd keeps for the backward: h and the weight, not the GELU's output (the size of h)."""
    h, weight, bias, _ = make_inputs((2, 64, 96), 24)
    h, weight, bias = (t.requires_grad_() for t in (h, weight, bias))
    kept, library_kept = saved_bytes(triton_path, h, weight, bias), saved_bytes(library, h, weight, bias)
    assert kept == h.nbytes + weight.nbytes
    assert library_kept == kept + h.nbytes


def test_the_backward_launches_as_many_kernels_as_autograds():
    """In a dry run for a GPU: the GELU's gradient is one Triton kernel where autograd runs gelu_backward, and
    the backward runs no other extra kernel."""
    h, weight, bias, grad = make_inputs((2, 64, 96), 24)
    counts = {}
    for impl in ('torch', 'triton'):
        leaves = [t.clone().requires_grad_() for t in (h, weight, bias)]
        with dry_run(H100) as launches:  # h made by an op, as in the MLPs (a dry run keeps the kernel's outputs)
            out = gelu_linear(leaves[0] * 2, *leaves[1:], impl=impl)
            with DispatchedOps() as ops:
                out.backward(grad)
        counts[impl] = (len(ops.kernels()), len(launches), 'gelu_backward' in ops.names)
    assert counts['torch'] == (counts['torch'][0], 0, True)
    assert counts['triton'] == (counts['torch'][0] - 1, 1, False)


def test_auto_runs_the_library_everywhere_and_the_kernels_only_when_asked():
    """'auto' keeps the library's layers on every device, a GPU's included (their launches cost its host less);
    'triton' runs the recomputing kernels, for a run that needs their memory."""
    h = torch.randn(2, 5, 16)
    assert resolve_recompute_impl('auto', h) == 'torch'
    assert resolve_recompute_impl('triton', h) == 'triton'
    with dry_run(H100):
        assert resolve_recompute_impl('auto', h) == 'torch'
        assert resolve_recompute_impl('auto', h.bfloat16()) == 'torch'
        assert resolve_recompute_impl('triton', h.bfloat16()) == 'triton'
    if torch.cuda.is_available():
        assert resolve_recompute_impl('auto', h.cuda()) == 'torch'


def test_choices_and_errors(monkeypatch):
    h, weight, bias, _ = make_inputs((2, 5, 16), 8)
    assert torch.equal(gelu_linear(h, weight, bias), library(h, weight, bias))  # 'auto' on the CPU
    with pytest.raises(ValueError, match="impl must be one of auto, torch, triton, got 'fused'"):
        gelu_linear(h, weight, bias, impl='fused')
    with pytest.raises(TypeError, match='gelu_linear expects its operands in one dtype'):
        gelu_linear(h, weight, bias.half(), impl='triton')
    with pytest.raises(TypeError, match='gated_linear expects its operands in one dtype'):
        gated_linear(h, h, weight.double(), bias.double(), impl='triton')
    with pytest.raises(ValueError, match=r'gated_linear expects s and g of one shape, got \(2, 5, 16\) and '
                       r'\(2, 1, 16\)'):
        gated_linear(h, h[:, :1], weight, bias)
    kernels_compiled(monkeypatch)
    with pytest.raises(AttnImplUnavailable, match=r"backward of gelu_linear cannot run here: .*CUDA tensors.*"
                       r"impl='torch' \(MMPOLA_RECOMPUTE=torch\)"):
        gelu_linear(h.cpu(), weight.cpu(), bias.cpu(), impl='triton')



def test_kernels_a_backbone_asks_for_where_they_cannot_run_name_its_argument(monkeypatch):
    """A backbone's recompute (a config's choice, which wins over MMPOLA_RECOMPUTE) asking for the kernels on CPU
    tensors without Triton's interpreter: the error names that argument as the way out, not the variable, which
    would change nothing; the variable's own choice names the variable."""
    from mmpola.models import PolaPVT
    from tests.fixtures.backbones import TINY_PVT
    kernels_compiled(monkeypatch)
    x = torch.randn(1, 3, 64, 64)
    for choice in ('elementwise', 'triton'):
        with pytest.raises(AttnImplUnavailable, match=r"cannot run here: .*CUDA tensors.*; use impl='torch' \(the "
                           r"backbone's recompute='torch', model.backbone.recompute in a config\)$"):
            PolaPVT(arch=TINY_PVT, recompute=choice).train()(x)
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'elementwise')
    with pytest.raises(AttnImplUnavailable, match=r"cannot run here: .*; use impl='torch' \(MMPOLA_RECOMPUTE=torch\)$"):
        PolaPVT(arch=TINY_PVT).train()(x)
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'torch')
    assert all(o.isfinite().all() for o in PolaPVT(arch=TINY_PVT).train()(x))

@pytest.mark.parametrize('mlp_type', ['mlp', 'conv_mlp'])
def test_mlps_run_the_implementation_the_environment_names(monkeypatch, mlp_type):
    """mmpola's MLPs keep their modules and keys; MMPOLA_RECOMPUTE=triton runs their GELU and fc2 through
    the kernel in training, with the library's output and gradients (Mlp's fc1 without its bias, which the
    GELU's kernel adds); dropout between them keeps the library path (it would have to keep its mask)."""
    torch.manual_seed(0)
    mlp = (Mlp(24, 96) if mlp_type == 'mlp' else ConvMlp(24, 96)).to(DEVICE)
    assert {'fc1.weight', 'fc2.weight', 'fc2.bias'} <= set(mlp.state_dict())
    x = torch.randn(2, 30, 24, device=DEVICE)
    args = (x, ) if mlp_type == 'mlp' else (x.requires_grad_(), (5, 6))
    results = []
    for impl in ('torch', 'triton'):
        monkeypatch.setenv('MMPOLA_RECOMPUTE', impl)
        mlp.zero_grad()
        with DispatchedOps() as ops:
            mlp(*args).square().sum().backward()
        assert ('gelu_backward' in ops.names) == (impl == 'torch')
        # fc1's bias: summed over the 60 tokens by the library's layer, in the GELU's kernel by Mlp's path
        token_sums = [shape for name, shape in zip(ops.names, ops.shapes)
                      if name == 'sum' and shape is not None and shape[-1] == 96 and shape.numel() >= 60 * 96]
        assert bool(token_sums) == (impl == 'torch' or mlp_type == 'conv_mlp'), (impl, token_sums)
        results.append([p.grad.clone() for p in mlp.parameters()])
    for a, e in zip(*results):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-6)
    mlp.drop.p = 0.1
    with DispatchedOps() as ops:
        mlp(*args).sum().backward()
    assert 'gelu_backward' in ops.names



def test_elementwise_runs_the_kernels_after_element_wise_ops_and_the_librarys_layer_norms(monkeypatch):
    """MMPOLA_RECOMPUTE=elementwise: a Pola block's MLP (GELU and fc2) and gated projection recompute their input in
    the kernels, its LayerNorms stay the library's (their backward runs); the library's output and gradients, and
    the block keeps less than with the library's layers and more than with every kernel ('triton')."""
    from mmpola.models.attention.pola import PolaAttention
    from mmpola.ops.recompute import recompute_layers_impl
    for choice, expected in {'auto': ('torch', 'torch'), 'torch': ('torch', 'torch'), 'triton': ('triton', 'triton'),
                             'elementwise': ('triton', 'torch')}.items():
        monkeypatch.setenv('MMPOLA_RECOMPUTE', choice)
        assert (recompute_layers_impl(True), recompute_layers_impl(False)) == expected, choice
    torch.manual_seed(0)
    hw, dim = (5, 6), 24
    block = PreNormBlock(dim, PolaAttention(dim, 2, hw)).to(DEVICE).train()
    x = torch.randn(2, 30, dim, device=DEVICE, requires_grad=True)
    results, ops_of, saved = [], {}, {}
    for choice in ('torch', 'elementwise', 'triton'):
        monkeypatch.setenv('MMPOLA_RECOMPUTE', choice)
        block.zero_grad()
        x.grad = None
        with DispatchedOps() as ops:
            out, saved[choice] = saved_for_backward(block, x, hw)
            out.square().sum().backward()
        ops_of[choice] = ops.names
        results.append([out.detach(), x.grad.clone()] + [p.grad.clone() for p in block.parameters()])
    for other in results[1:]:
        for a, e in zip(other, results[0]):
            assert relative_error(a, e) <= 1e-5, relative_error(a, e)
    assert 'gelu_backward' in ops_of['torch'] and 'gelu_backward' not in ops_of['elementwise']
    norms = {choice: names.count('native_layer_norm_backward') for choice, names in ops_of.items()}
    assert norms['elementwise'] == norms['torch'] == 2 and norms['triton'] == 0, norms
    assert saved['torch'] > saved['elementwise'] > saved['triton'], saved

# the gate: s (B, N, C) and g seen in a projection of 4 C channels per token (Pola's fused layout: row stride 4 C)
def make_gate_inputs(B, N, C, out_features, dtype=torch.float32, seed=0):
    """s (B, N, C), g (B, N, C) (a view of a (B, N, 4 C) projection), weight, bias, dL/dout."""
    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(B, N, C, generator=gen)
    projection = torch.randn(B, N, 4 * C, generator=gen)
    weight = torch.randn(out_features, C, generator=gen) / C ** 0.5
    bias = torch.randn(out_features, generator=gen)
    grad = torch.randn(B, N, out_features, generator=gen)
    s, projection, weight, bias, grad = (t.to(device=DEVICE, dtype=dtype) for t in (s, projection, weight, bias, grad))
    return s, projection, weight, bias, grad


def gate_library(s, projection, weight, bias=None):
    C = s.shape[-1]
    return F.linear(s * projection[..., C:2 * C], weight, bias)


def gate_triton(s, projection, weight, bias=None):
    C = s.shape[-1]
    return gated_linear(s, projection[..., C:2 * C], weight, bias, impl='triton')


@pytest.mark.parametrize('shape', SHAPES[:2] + [(1, 1, 8), (2, 33, 96)], ids=lambda s: 'x'.join(map(str, s)))
def test_gated_linear_matches_the_library(shape):
    """fp32 within 1e-6 of the float64 library layers: output and the gradients of s, the projection the gate
    is a view of (zero outside the gate's channels), weight and bias."""
    s, projection, weight, bias, grad = make_gate_inputs(*shape, 24)
    actual = forward_backward(gate_triton, [s, projection, weight, bias], grad)
    expected = forward_backward(gate_library, [t.double() for t in (s, projection, weight, bias)], grad.double())
    for name, a, e in zip(('out', 'ds', 'dprojection', 'dweight', 'dbias'), actual, expected):
        assert a.dtype == torch.float32 and a.shape == e.shape, name
        assert relative_error(a, e) <= 1e-6, f'{shape} {name}: {relative_error(a, e):.2e}'


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_gated_linear_half_precision_and_autocast(dtype):
    s, projection, weight, bias, grad = make_gate_inputs(2, 9, 64, 32, dtype)
    actual = forward_backward(gate_triton, [s, projection, weight, bias], grad)
    own = forward_backward(gate_library, [s, projection, weight, bias], grad)
    for name, a, e in zip(('out', 'ds', 'dprojection', 'dweight', 'dbias'), actual, own):
        assert a.dtype == dtype and relative_error(a, e) <= 1e-2, name
    s, projection, weight, bias, grad = make_gate_inputs(2, 9, 64, 32)
    results = []
    for fn in (gate_triton, gate_library):
        leaves = [t.clone().requires_grad_() for t in (s, projection, weight, bias)]
        with torch.autocast(DEVICE, dtype=dtype):
            out = fn(*leaves)
        out.backward(grad.to(out.dtype))
        results.append([out] + [t.grad for t in leaves])
    for name, a, e in zip(('out', 'ds', 'dprojection', 'dweight', 'dbias'), *results):
        assert a.dtype == e.dtype and relative_error(a, e) <= 1e-2, name
    assert results[0][0].dtype == dtype and results[0][3].dtype == torch.float32


def test_gated_linear_keeps_its_operands_and_launches_one_kernel_fewer():
    """The backward keeps s and the gate (here a view of its projection, whose storage counts), not their
    product; one Triton kernel gives the product and both gradients where autograd runs two products."""
    s, projection, weight, bias, grad = make_gate_inputs(2, 64, 32, 24)
    leaves = [t.requires_grad_() for t in (s, projection, weight, bias)]
    kept, library_kept = saved_bytes(gate_triton, *leaves), saved_bytes(gate_library, *leaves)
    assert kept == s.nbytes + projection.nbytes + weight.nbytes
    assert library_kept == kept + s.nbytes
    counts = {}
    for impl, fn in (('torch', gate_library), ('triton', gate_triton)):
        leaves = [t.detach().clone().requires_grad_() for t in (s, projection, weight, bias)]
        with dry_run(H100) as launches:
            out = fn(leaves[0] * 2, *leaves[1:])  # s made by an op, as in the models
            with DispatchedOps() as ops:
                out.backward(grad)
        counts[impl] = (len(ops.kernels()), len(launches), ops.names.count('mul'))
    assert counts['triton'][1:] == (1, 1) and counts['torch'][1:] == (0, 3), counts  # mul: the `* 2`'s backward
    assert counts['triton'][0] == counts['torch'][0] - 2, counts


def test_gated_linear_takes_a_gate_of_any_strides():
    """A gate whose channels are not contiguous (a transposed view) is copied for the kernel; a frozen s, or
    a frozen gate, gets no gradient."""
    s, projection, weight, bias, grad = make_gate_inputs(2, 6, 16, 8)
    g_t = torch.randn(2, 16, 6, device=DEVICE).transpose(1, 2)
    expected = forward_backward(lambda a, b: F.linear(a * b, weight.double(), bias.double()),
                                [s.double(), g_t.double()], grad.double())
    actual = forward_backward(lambda a, b: gated_linear(a, b, weight, bias, impl='triton'), [s, g_t], grad)
    assert all(relative_error(a, e) <= 1e-6 for a, e in zip(actual, expected))
    frozen = s.clone().requires_grad_()
    gated_linear(frozen, g_t, weight, bias, impl='triton').backward(grad)
    assert relative_error(frozen.grad, expected[1]) <= 1e-6


@pytest.mark.parametrize('kind', ['pola', 'pacs'])
def test_gated_attentions_run_the_implementation_the_environment_names(monkeypatch, kind):
    """Pola's and PolaFormer++'s gated output projections: MMPOLA_RECOMPUTE=triton gives the library's
    gradients, and its backward runs one product fewer."""
    from mmpola.models.attention.pacs import PaCSAttention
    from mmpola.models.attention.pola import PolaAttention
    from mmpola.models.backbones.polapp import RotaryEmbedding
    torch.manual_seed(0)
    hw = (4, 5)
    if kind == 'pola':
        attn, context = PolaAttention(32, 2, hw), {}
    else:  # the tables PolaFormer++'s stages give their linear blocks
        attn, context = PaCSAttention(32, 2), {'rope_feature': RotaryEmbedding(64, 2)(hw).to(DEVICE)}
    attn = attn.to(DEVICE)
    x = torch.randn(2, 20, 32, device=DEVICE)
    results, muls = [], []
    for impl in ('torch', 'triton'):
        monkeypatch.setenv('MMPOLA_RECOMPUTE', impl)
        attn.zero_grad()
        with DispatchedOps() as ops:
            attn(x, hw, **context).square().sum().backward()
        muls.append(ops.names.count('mul'))
        results.append([p.grad.clone() for p in attn.parameters()])
    for a, e in zip(*results):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)
    assert muls[1] < muls[0], muls


@pytest.mark.parametrize('kind', ['pola', 'pacs'])
def test_with_elementwise_the_attentions_kernels_multiply_by_the_gate(monkeypatch, kind):
    """Where the attention's core and convolution run in their Triton kernels (one Function that takes the
    projection), that Function multiplies by the gate with MMPOLA_RECOMPUTE=elementwise, as with the library's
    layers: no node of gated_linear's, the same output and gradients bit for bit. With every layer's kernels
    ('triton') gated_linear's kernels take the gate: the library's results within rounding."""
    from mmpola.models.attention.pacs import PaCSAttention
    from mmpola.models.attention.pola import PolaAttention
    from mmpola.models.backbones.polapp import RotaryEmbedding
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'triton')
    torch.manual_seed(0)
    hw = (4, 5)
    if kind == 'pola':
        attn, context = PolaAttention(32, 2, hw, attn_impl='triton'), {}
    else:
        attn = PaCSAttention(32, 2, attn_impl='triton')
        context = {'rope_feature': RotaryEmbedding(64, 2)(hw).to(DEVICE)}
    attn = attn.to(DEVICE)
    x = torch.randn(2, 20, 32, device=DEVICE)
    results, nodes = {}, {}
    for choice in ('torch', 'elementwise', 'triton'):
        monkeypatch.setenv('MMPOLA_RECOMPUTE', choice)
        attn.zero_grad()
        out = attn(x, hw, **context)
        nodes[choice] = autograd_node_names(out)
        out.square().sum().backward()
        results[choice] = [out.detach()] + [p.grad.clone() for p in attn.parameters()]
    assert all('_ValueTermTritonBackward' in names for names in nodes.values()), nodes
    assert '_RecomputedLinearBackward' in nodes['triton'] and 'UnbindBackward0' in nodes['triton']
    assert 'UnbindBackward0' not in nodes['elementwise'] | nodes['torch']
    assert '_RecomputedLinearBackward' not in nodes['elementwise'] | nodes['torch']
    for a, e in zip(results['elementwise'], results['torch']):
        assert torch.equal(a, e)
    for a, e in zip(results['triton'], results['torch']):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


# the LayerNorm and the linear layer after it: x (..., C), the norm's weight and bias, weight (out, C), bias
def make_norm_inputs(shape, out_features, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    C = shape[-1]
    x = torch.randn(*shape, generator=gen) * 3 + 1
    norm_weight, norm_bias = torch.randn(C, generator=gen), torch.randn(C, generator=gen)
    weight = torch.randn(out_features, C, generator=gen) / C ** 0.5
    bias = torch.randn(out_features, generator=gen)
    grad = torch.randn(*shape[:-1], out_features, generator=gen)
    return [t.to(device=DEVICE, dtype=dtype) for t in (x, norm_weight, norm_bias, weight, bias, grad)]


def norm_library(x, norm_weight, norm_bias, weight, bias=None):
    return F.linear(F.layer_norm(x, x.shape[-1:], norm_weight, norm_bias, 1e-5), weight, bias)


def norm_triton(x, norm_weight, norm_bias, weight, bias=None):
    return layer_norm_linear(x, norm_weight, norm_bias, 1e-5, weight, bias, impl='triton')


NORM_NAMES = ('out', 'dx', 'dnorm_weight', 'dnorm_bias', 'dweight', 'dbias')


# rows of a few channels to many (one row a block), row counts on either side of the kernel's row blocks
@pytest.mark.parametrize('shape', [(2, 7, 40), (4, 2049, 24), (1, 1, 8), (3, 130), (2, 5, 3000)],
                         ids=lambda s: 'x'.join(map(str, s)))
def test_layer_norm_linear_matches_the_library(shape):
    """fp32 within 1e-6 of the float64 library layers: output and the gradients of x, the norm's weight and
    bias, the weight and the bias, in their dtypes and shapes."""
    *leaves, grad = make_norm_inputs(shape, 17)
    actual = forward_backward(norm_triton, leaves, grad)
    expected = forward_backward(norm_library, [t.double() for t in leaves], grad.double())
    for name, a, e in zip(NORM_NAMES, actual, expected):
        assert a.dtype == torch.float32 and a.shape == e.shape, name
        assert relative_error(a, e) <= 1e-6, f'{shape} {name}: {relative_error(a, e):.2e}'


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_layer_norm_linear_half_precision_and_autocast(dtype):
    """Half-precision operands against the library's own path in that dtype; under autocast (float32 x and
    parameters, as a model's residual stream) the layer computes in the autocast dtype, the gradients come
    back in the leaves' dtypes."""
    *leaves, grad = make_norm_inputs((2, 9, 64), 32, dtype)
    actual = forward_backward(norm_triton, leaves, grad)
    expected = forward_backward(norm_library, [t.double() for t in leaves], grad.double())
    own = forward_backward(norm_library, leaves, grad)
    for name, a, e, o in zip(NORM_NAMES, actual, expected, own):
        assert a.dtype == dtype, name
        assert relative_error(a, e) <= 2 * relative_error(o, e) + 1e-3, name
    *leaves, grad = make_norm_inputs((2, 9, 64), 32)
    results = []
    for fn in (norm_triton, norm_library):
        inputs = [t.clone().requires_grad_() for t in leaves]
        with torch.autocast(DEVICE, dtype=dtype):
            out = fn(*inputs)
        out.backward(grad.to(out.dtype))
        results.append([out] + [t.grad for t in inputs])
    for name, a, e in zip(NORM_NAMES, *results):
        assert a.dtype == e.dtype and relative_error(a, e) <= 1e-2, name
    assert results[0][0].dtype == dtype and results[0][1].dtype == torch.float32


def test_layer_norm_linear_only_some_gradients():
    """A frozen norm, a frozen input, a frozen linear layer, no bias."""
    *leaves, grad = make_norm_inputs((3, 20), 8)
    expected = forward_backward(norm_library, [t.double() for t in leaves], grad.double())
    for frozen in ({1, 2}, {0}, {0, 1, 2}, {3, 4}):
        inputs = [t.clone().requires_grad_(i not in frozen) for i, t in enumerate(leaves)]
        norm_triton(*inputs).backward(grad)
        for i, t in enumerate(inputs):
            assert (t.grad is None) == (i in frozen), (frozen, i)
            if t.grad is not None:
                assert relative_error(t.grad, expected[i + 1]) <= 1e-6, (frozen, i)
    actual = forward_backward(norm_triton, leaves[:4], grad)
    expected = forward_backward(norm_library, [t.double() for t in leaves[:4]], grad.double())
    assert all(relative_error(a, e) <= 1e-6 for a, e in zip(actual, expected))


def test_layer_norm_linear_keeps_the_norms_input_only():
    """What autograd keeps: x and the parameters, not the normalised rows (the size of x); the backward runs
    the library's kernel count (the norm's backward is the Triton kernel and the sum of its partial sums), and
    no native_layer_norm_backward."""
    *leaves, grad = make_norm_inputs((2, 64, 96), 24)
    leaves = [t.requires_grad_() for t in leaves]
    params = sum(t.nbytes for t in leaves[1:4])
    kept, library_kept = saved_bytes(norm_triton, *leaves), saved_bytes(norm_library, *leaves)
    assert kept == leaves[0].nbytes + params
    assert library_kept >= kept + leaves[0].nbytes  # the rows (and the library's mean and rstd)
    counts = {}
    for impl, fn in (('torch', norm_library), ('triton', norm_triton)):
        inputs = [t.detach().clone().requires_grad_() for t in leaves]
        with dry_run(H100) as launches:
            x = inputs[0] * 2  # made by an op, as in the models
            with DispatchedOps() as forward:
                out = fn(x, *inputs[1:])
            forward_launches = len(launches)
            with DispatchedOps() as backward:
                out.backward(grad)
        counts[impl] = (len(forward.kernels()), len(backward.kernels()), forward_launches,
                        len(launches) - forward_launches, 'native_layer_norm_backward' in backward.names)
    assert counts['torch'][2:] == (0, 0, True) and counts['triton'][2:] == (1, 1, False), counts
    # the forward: the kernel in the library's LayerNorm's place; the backward: the sum of the partial sums
    assert counts['triton'][:2] == (counts['torch'][0] - 1, counts['torch'][1]), counts


def test_layer_norm_linear_choices_and_errors(monkeypatch):
    x, norm_weight, norm_bias, weight, bias, _ = make_norm_inputs((2, 5, 16), 8)
    assert torch.equal(layer_norm_linear(x, norm_weight, norm_bias, 1e-5, weight, bias),
                       norm_library(x, norm_weight, norm_bias, weight, bias))  # 'auto' on the CPU
    with pytest.raises(ValueError, match=r'layer_norm_linear expects a norm weight and bias of \(16, \) and a '
                       r'weight \(out, 16\) for x of 16 channels, got \(8,\)'):
        layer_norm_linear(x, norm_weight[:8], norm_bias, 1e-5, weight, bias)
    with pytest.raises(TypeError, match='layer_norm_linear expects its operands in one dtype'):
        layer_norm_linear(x, norm_weight, norm_bias, 1e-5, weight.half(), bias.half(), impl='triton')
    wide = torch.randn(2, 8200)
    with pytest.raises(ValueError, match='the LayerNorm kernel takes rows of up to 8192 channels, got 8200'):
        layer_norm_linear(wide, torch.ones(8200), torch.zeros(8200), 1e-5, torch.zeros(2, 8200), impl='triton')
    with dry_run(H100):  # 'auto' where the kernels run: the library's layers for rows wider than theirs
        out = layer_norm_linear(wide, torch.ones(8200), torch.zeros(8200), 1e-5, torch.zeros(2, 8200))
    assert out.shape == (2, 2)
    from mmpola.models.layers import norm_linear
    linears = (torch.nn.Linear(16, 32), torch.nn.Linear(16, 16))
    with pytest.raises(ValueError, match='takes a tuple of linear layers, or repeats operands, with the chunk size'):
        norm_linear(torch.nn.LayerNorm(16), linears, x.cpu())
    with pytest.raises(ValueError, match='takes a tuple of linear layers, or repeats operands, with the chunk size'):
        norm_linear(torch.nn.LayerNorm(16), linears[0], x.cpu(), repeat=(0, ))
    assert [t.shape for t in norm_linear(torch.nn.LayerNorm(16), linears, x.cpu(), chunk=16)] == [(2, 5, 16)] * 3
    kernels_compiled(monkeypatch)
    with pytest.raises(AttnImplUnavailable, match=r"backward of layer_norm_linear cannot run here: .*CUDA "
                       r"tensors.*impl='torch' \(MMPOLA_RECOMPUTE=torch\)"):
        layer_norm_linear(x.cpu(), norm_weight.cpu(), norm_bias.cpu(), 1e-5, weight.cpu(), bias.cpu(),
                          impl='triton')


# the output taken apart into operands (chunk), one of them used twice (repeat): (shape, out, chunk, repeat)
OPERAND_CASES = [((2, 7, 40), 64, 16, (2, )), ((4, 2049, 24), 48, 16, ()), ((3, 130), 32, 32, (0, )),
                 ((2, 5, 24), 80, 16, (3, ))]  # the last: five operands, more than the kernel takes


def operands_loss(impl, chunk, repeat):
    """The function of the leaves (x, the norm's weight and bias, weight, bias) whose backward the tests take: a
    sum over every operand (and the repeated ones) times fixed weights of its own, so that each operand's
    gradient differs."""
    def fn(x, norm_weight, norm_bias, weight, bias):
        operands = layer_norm_linear(x, norm_weight, norm_bias, 1e-5, weight, bias, impl=impl, chunk=chunk,
                                     repeat=repeat)
        gen = torch.Generator().manual_seed(1)
        weights = [torch.randn(operands[0].shape, generator=gen).to(x.device) for _ in operands]
        return sum((o * w.to(o.dtype)).sum() for o, w in zip(operands, weights)), operands
    return fn


def operands_results(fn, leaves, dtype=None):
    """[each operand, the gradients of the leaves] of ``fn``, the leaves in ``dtype``."""
    leaves = [t.detach().to(dtype or t.dtype).clone().requires_grad_() for t in leaves]
    loss, operands = fn(*leaves)
    loss.backward()
    return [o.detach() for o in operands] + [t.grad for t in leaves]


@pytest.mark.parametrize('case', OPERAND_CASES, ids=lambda c: f'{"x".join(map(str, c[0]))}-{c[1]}-{c[2]}-{c[3]}')
def test_layer_norm_linear_operands_match_the_library(case):
    """``chunk`` and ``repeat``: the operands are views of the output, one after another, the repeated one once
    more after them; their gradients (the repeated one's two added) give those of x, the norm, the weight and
    the bias within 1e-6 of the float64 library layers (whose autograd stacks them)."""
    shape, out_features, chunk, repeat = case
    *leaves, _ = make_norm_inputs(shape, out_features)
    actual = operands_results(operands_loss('triton', chunk, repeat), leaves)
    expected = operands_results(operands_loss('torch', chunk, repeat), [t.double() for t in leaves])
    count = out_features // chunk
    assert len(actual) == len(expected) == count + len(repeat) + 5
    first = actual[0]
    for i, operand in enumerate(actual[:count + len(repeat)]):
        assert operand.shape == (*shape[:-1], chunk)
        assert operand.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()  # views of one output
    if repeat:
        assert torch.equal(actual[count], actual[repeat[0]])
    for name, a, e in zip([f'operand {i}' for i in range(count + len(repeat))] + list(NORM_NAMES[1:]), actual,
                          expected):
        assert a.dtype == torch.float32 and a.shape == e.shape, name
        assert relative_error(a, e) <= 1e-6, f'{case} {name}: {relative_error(a, e):.2e}'


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_layer_norm_linear_operands_under_autocast(dtype):
    """Under autocast, float32 leaves: the operands in the autocast dtype, and every gradient within rounding of
    the library's in its dtypes (the repeated operand's two gradients added and rounded once, as autograd adds
    them; the bias's summed in float32 where the library sums in the autocast dtype)."""
    *leaves, _ = make_norm_inputs((2, 33, 32), 128)
    results = []
    for impl in ('triton', 'torch'):
        with torch.autocast(DEVICE, dtype=dtype):
            results.append(operands_results(operands_loss(impl, 32, (2, )), leaves))
    expected = operands_results(operands_loss('torch', 32, (2, )), [t.double() for t in leaves])
    for i, (a, o, e) in enumerate(zip(*results, expected)):
        assert a.dtype == o.dtype == (dtype if i < 5 else torch.float32), i
        assert relative_error(a, e) <= 2 * relative_error(o, e) + 1e-3, i


def test_layer_norm_linear_operands_launch_one_kernel_for_their_gradients():
    """A dry run: the backward of the operands (the library's autograd: a stack, the repeated operand's addition
    and the bias's sum over the stacked gradient) is one kernel and the sum of its partial sums; no stack and no
    addition."""
    *leaves, _ = make_norm_inputs((2, 64, 32), 128)
    counts = {}
    for impl in ('torch', 'triton'):
        inputs = [t.detach().clone().requires_grad_() for t in leaves]
        with dry_run(H100) as launches:
            loss, _ = operands_loss(impl, 32, (2, ))(inputs[0] * 2, *inputs[1:])
            forward_launches = len(launches)
            with DispatchedOps() as backward:
                loss.backward()
        names = [name for name, view in zip(backward.names, backward.views) if not view]
        counts[impl] = (len(launches) - forward_launches, names.count('stack'), names.count('add'),
                        len(backward.kernels()))
    assert counts['torch'][:3] == (0, 1, 1), counts
    assert counts['triton'][:3] == (2, 0, 0), counts  # the operands' kernel, the LayerNorm's
    # the stack, the addition and the bias's sum (and the library's LayerNorm backward) -> the sums of the two
    # kernels' partial sums
    assert counts['triton'][3] < counts['torch'][3], counts


@pytest.mark.parametrize('scaled', [False, True], ids=['sum', 'scaled'])
def test_add_layer_norm_linear_operands_match_the_library(scaled):
    """add_layer_norm_linear with ``chunk`` and ``repeat``: the sum, then the operands (a dropped sample's
    factor among the factors), and the gradients of the six leaves within 1e-6 of the float64 library's, the
    sum's gradient from the layers after it added."""
    x, branch, norm_weight, norm_bias, weight, bias, grad_sum, _ = make_add_norm_inputs((2, 7, 24), 64)
    scale = torch.tensor([0., 1.6]) if scaled else None

    def fn(impl, dtype):
        def run(x, branch, norm_weight, norm_bias, weight, bias):
            s, *operands = add_layer_norm_linear(
                x, branch, norm_weight, norm_bias, 1e-5, weight, bias, impl=impl, chunk=16, repeat=(2, ),
                scale=None if scale is None else scale.to(device=DEVICE, dtype=dtype))
            gen = torch.Generator().manual_seed(1)
            weights = [torch.randn(s.shape[:-1] + (16, ), generator=gen).to(s.device) for _ in operands]
            loss = sum((o * w.to(o.dtype)).sum() for o, w in zip(operands, weights)) + (s * grad_sum.to(s.dtype)).sum()
            return loss, [s, *operands]
        return run

    leaves = (x, branch, norm_weight, norm_bias, weight, bias)
    actual = operands_results(fn('triton', torch.float32), leaves)
    expected = operands_results(fn('torch', torch.float64), [t.double() for t in leaves])
    assert len(actual) == 1 + 4 + 1 + 6
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.dtype == torch.float32 and a.shape == e.shape, i
        assert relative_error(a, e) <= 1e-6, f'{i}: {relative_error(a, e):.2e}'
    if scaled:
        assert not actual[7][0].any()  # the branch's gradient of the dropped sample


def test_layer_norm_linear_operands_errors():
    x, norm_weight, norm_bias, weight, bias, _ = make_norm_inputs((2, 5, 16), 48)
    for chunk, repeat, message in ((20, (), 'takes operands of a chunk size that divides the 48 outputs, got 20'),
                                   (16, (0, 1), r'repeats at most one of its 3 operands, got \(0, 1\)'),
                                   (16, (3, ), r'repeats at most one of its 3 operands, got \(3,\)'),
                                   (None, (0, ), 'repeats operands of a chunk size only')):
        with pytest.raises(ValueError, match=message):
            layer_norm_linear(x, norm_weight, norm_bias, 1e-5, weight, bias, chunk=chunk, repeat=repeat)
    from mmpola.ops.recompute_triton import operand_grads
    grads = [torch.zeros(4, 8)] * 5
    with pytest.raises(ValueError, match='operand_grads takes 1 to 4 gradients and an extra one with its index'):
        operand_grads(grads)
    with pytest.raises(ValueError, match='operand_grads expects gradients'):
        operand_grads([torch.zeros(4, 8), torch.zeros(4, 8).t()])


@pytest.mark.parametrize('module', ['block', 'conv_block', 'pola_block', 'pola_pvt_block', 'flatten_block',
                                    'flatten_pvt_block', 'inline_block', 'merging', 'cswin'])
def test_norms_before_linear_layers_run_the_implementation_the_environment_names(monkeypatch, module):
    """The blocks' LayerNorm before the MLP (PVT, Swin, the ViT; PVTv2's MLP with its depthwise conv) and before
    Pola's and FLatten's projections (Swin's fused one; PVT's two of the tokens, as one product; not InLine's,
    which also takes the mean of the normalised tokens, nor those of a spatial-reduction attention), Swin's
    patch merging and CSWin's block (both its norms: before the shared projection and before the MLP):
    MMPOLA_RECOMPUTE=triton gives the library's output and gradients and no native_layer_norm_backward for
    those norms; the modules and their keys stay."""
    from mmpola.models import CSWinBackbone
    from mmpola.models.attention.flatten import FocusedLinearAttention
    from mmpola.models.attention.inline import InLineAttention
    from mmpola.models.attention.pola import PolaAttention
    from mmpola.models.attention.softmax import SpatialReductionAttention
    from tests.fixtures.backbones import MINI_CSWIN
    torch.manual_seed(0)
    hw, dim = (5, 6), 24
    attentions = {'pola_block': lambda: PolaAttention(dim, 2, hw), 'inline_block': lambda: InLineAttention(dim, 2),
                  'pola_pvt_block': lambda: PolaAttention(dim, 2, hw, qkv_layout='separate'),
                  'flatten_block': lambda: FocusedLinearAttention(dim, 2, hw),
                  'flatten_pvt_block': lambda: FocusedLinearAttention(dim, 2, hw, qkv_layout='separate')}
    if module == 'merging':
        layer, norms = PatchMerging(dim), 1
    elif module == 'cswin':
        layer, norms = CSWinBackbone(arch=MINI_CSWIN, attn='flatten', attn_type='LLLL').stage2[0], 2
        dim = layer.dim
    elif module in attentions:
        attn = attentions[module]()
        assert attn.takes_norm == (module != 'inline_block')
        if module == 'pola_pvt_block':  # a spatial reduction: the block normalises (and a module given the norm)
            reduced = PolaAttention(dim, 2, hw, qkv_layout='separate', sr_ratio=2).to(DEVICE)
            tokens, norm = torch.randn(2, 30, dim, device=DEVICE), torch.nn.LayerNorm(dim).to(DEVICE)
            assert not reduced.takes_norm
            torch.testing.assert_close(reduced(tokens, hw, norm=norm), reduced(norm(tokens), hw), rtol=0, atol=0)
        layer, norms = PreNormBlock(dim, attn), 1 + attn.takes_norm
    else:
        mlp_layer = Mlp if module == 'block' else ConvMlp
        layer, norms = PreNormBlock(dim, SpatialReductionAttention(dim, 2), mlp_layer=mlp_layer), 1
    layer = layer.to(DEVICE).train()
    keys = set(layer.state_dict())
    args = (hw, )
    x = torch.randn(2, 30, dim, device=DEVICE, requires_grad=True)
    results, counts = [], []
    for impl in ('torch', 'triton'):
        monkeypatch.setenv('MMPOLA_RECOMPUTE', impl)
        layer.zero_grad()
        x.grad = None
        with DispatchedOps() as ops:
            out = layer(x, *args)
            out = out[0] if isinstance(out, tuple) else out
            out.square().sum().backward()
        counts.append(ops.names.count('native_layer_norm_backward'))
        results.append([out.detach(), x.grad.clone()] + [p.grad.clone() for p in layer.parameters()])
    for a, e in zip(*results):
        assert relative_error(a, e) <= 1e-5, relative_error(a, e)  # of the largest value
    assert counts[1] == counts[0] - norms, counts
    assert set(layer.state_dict()) == keys



@pytest.mark.parametrize('amp', [None, torch.bfloat16], ids=['fp32', 'bf16-autocast'])
def test_norms_before_linear_layers_use_the_kernel_without_autograd(monkeypatch, amp):
    """Without autograd (inference, a detector's evaluation) the blocks' LayerNorms before linear layers still
    run the kernel, which writes the rows in the linear layer's dtype: the library's output, no native_layer_norm
    for those norms and, under autocast, no float32 rows cast to the linear layers' dtype."""
    from mmpola.models.attention.pola import PolaAttention
    torch.manual_seed(0)
    hw, dim = (5, 6), 24
    block = PreNormBlock(dim, PolaAttention(dim, 2, hw, qkv_layout='separate')).to(DEVICE).eval()
    x = torch.randn(2, 30, dim, device=DEVICE)
    outs, ops = [], []
    for impl in ('torch', 'triton'):
        monkeypatch.setenv('MMPOLA_RECOMPUTE', impl)
        with torch.no_grad(), torch.autocast(DEVICE, amp or torch.bfloat16, enabled=amp is not None), \
                DispatchedOps() as dispatched:
            outs.append(block(x, hw).float())
        ops.append(dispatched)
    assert relative_error(outs[1], outs[0]) <= (1e-5 if amp is None else 1e-2)
    # the norm before Pola's two projections (one product here) and the one before the MLP
    assert [op.names.count('native_layer_norm') for op in ops] == [2, 0]
    # under autocast the library's float32 rows of both norms cast once each (Pola's two projections make one
    # product on either path)
    row_casts = [sum(1 for name, shape in zip(op.names, op.shapes) if name == '_to_copy' and shape == x.shape)
                 for op in ops]
    assert row_casts == ([0, 0] if amp is None else [2, 0]), row_casts


def test_norm_linear_keeps_the_concatenated_weights_without_autograd(monkeypatch):
    """Several linear layers of the normalised tokens (PVT's query and key-value projections) are one product
    with their weights and biases concatenated: without autograd the concatenation (cast to the autocast
    dtype under autocast) is made once and kept until a parameter changes; with autograd, at every call."""
    from mmpola.models.layers import norm_linear
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'triton')
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(16).to(DEVICE)
    layers = (torch.nn.Linear(16, 16).to(DEVICE), torch.nn.Linear(16, 32).to(DEVICE))
    x = torch.randn(2, 5, 16, device=DEVICE)

    def call(amp=None):
        with torch.autocast(DEVICE, amp or torch.bfloat16, enabled=amp is not None), DispatchedOps() as ops:
            out = norm_linear(norm, layers, x, chunk=16)
        return out, ops.names.count('cat'), ops.names.count('_to_copy')

    with torch.no_grad():
        expected = [layer(norm(x)) for layer in layers]
        first, cats, _ = call()
        second, again, _ = call()
        assert (cats, again) == (2, 0)
        for a, e in zip(second, (expected[0], *expected[1].unflatten(-1, (2, 16)).unbind(-2))):
            assert relative_error(a, e) <= 1e-6
        _, cats, casts = call(torch.bfloat16)  # another dtype: made again, cast once
        assert cats == 2 and casts == 2
        assert call(torch.bfloat16)[1:] == (0, 0)
        layers[1].weight.mul_(2)  # an optimizer step, load_state_dict: a new version of the parameter
        changed, cats, _ = call()
        assert cats == 2 and relative_error(changed[1], layers[1](norm(x))[..., :16]) <= 1e-6
    assert call()[1] == 2 and call()[1] == 2  # with autograd: each call concatenates (the gradients reach both)


@pytest.mark.parametrize('amp', [None, torch.bfloat16])
def test_norm_linear_library_layers_make_one_product(amp, monkeypatch):
    """With the library's layers, several linear layers of the normalised tokens (the query and key-value
    projections of PVT's linear attention without spatial reduction) are one product of their weights and biases
    concatenated, with autograd too: one matrix product and its two gradient products where each layer would make
    its own, and one cast of the weights under autocast; outputs and gradients (in the parameters' own layouts)
    those of the layers called apart. Layers with hooks, or of another type than nn.Linear, are called as they are."""
    from mmpola.models.layers import norm_linear
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'torch')
    torch.manual_seed(0)
    norm = torch.nn.LayerNorm(16)
    x = torch.randn(2, 5, 16)

    def step(layers, joined):
        for p in [*norm.parameters(), *(p for layer in layers for p in layer.parameters())]:
            p.grad = None
        inp = x.clone().requires_grad_()
        with torch.autocast('cpu', amp or torch.bfloat16, enabled=amp is not None), DispatchedOps() as ops:
            if joined:
                out = norm_linear(norm, layers, inp, chunk=16, repeat=(2, ))
            else:
                y = norm(inp)
                out = [layers[0](y), *layers[1](y).unflatten(-1, (2, 16)).unbind(-2)]
                out.append(out[2])
            sum((o.float() * (i + 1)).sum() for i, o in enumerate(out)).backward()
        grads = [inp.grad] + [p.grad for layer in layers for p in layer.parameters()]
        return out, grads, ops

    layers = (torch.nn.Linear(16, 16), torch.nn.Linear(16, 32))
    expected, expected_grads, apart = step(layers, False)
    out, grads, ops = step(layers, True)
    assert len(out) == 4 and out[3] is out[2]
    dtype = amp or torch.float32
    tolerance = 1e-6 if amp is None else 1e-2
    for a, e in zip(out, expected):
        assert a.dtype == dtype and relative_error(a.float(), e.float()) <= tolerance
    for a, e, p in zip(grads[1:], expected_grads[1:], (p for layer in layers for p in layer.parameters())):
        assert a.stride() == p.stride() and relative_error(a, e) <= tolerance
    assert relative_error(grads[0], expected_grads[0]) <= tolerance
    products = [name for name in ops.names if name in ('addmm', 'mm', 'linear', 'matmul', 'bmm')]
    assert products.count('addmm') == 1 and products.count('mm') == 2, products
    assert apart.names.count('addmm') == 2 and apart.names.count('mm') == 4
    assert len(ops.kernels()) < len(apart.kernels())
    if amp is not None:  # the concatenated weight and bias cast once, and the input
        assert ops.names.count('_to_copy') < apart.names.count('_to_copy')

    class Linear(torch.nn.Linear):
        pass

    seen = []
    hooked = (torch.nn.Linear(16, 16), torch.nn.Linear(16, 32))
    hooked[1].register_forward_hook(lambda module, args, output: seen.append(output.shape))
    for layers in (hooked, (Linear(16, 16), Linear(16, 32))):
        out, _, ops = step(layers, True)
        assert ops.names.count('addmm') == 2 and 'cat' not in ops.names
    assert seen == [(2, 5, 32)]


# a residual connection and the LayerNorm with the linear layer after it: s = x + branch (* a factor per sample)
def make_add_norm_inputs(shape, out_features, dtype=torch.float32, seed=0):
    """x, branch, the norm's weight and bias, weight, bias, and the gradients of the sum and of the output."""
    gen = torch.Generator().manual_seed(seed)
    x, norm_weight, norm_bias, weight, bias, grad = make_norm_inputs(shape, out_features, dtype, seed)
    branch = torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)
    grad_sum = torch.randn(*shape, generator=gen).to(device=DEVICE, dtype=dtype)
    return x, branch, norm_weight, norm_bias, weight, bias, grad_sum, grad


def add_norm(impl, scale=None, grad_sum=True):
    """The function of the leaves (x, branch, norm weight and bias, weight, bias) whose backward the tests take:
    the sum's gradient from the layers after it and the output's (``grad_sum`` False: the output's only)."""
    def fn(x, branch, norm_weight, norm_bias, weight, bias, grad_s, grad_out):
        s, out = add_layer_norm_linear(x, branch, norm_weight, norm_bias, 1e-5, weight, bias, impl=impl,
                                       scale=None if scale is None else scale.to(device=DEVICE, dtype=branch.dtype))
        return s, out, (out * grad_out.to(out.dtype)).sum() + ((s * grad_s.to(s.dtype)).sum() if grad_sum else 0)
    return fn


def add_norm_results(fn, inputs, dtype=None):
    """[sum, output, the gradients of the six leaves] of ``fn``, the leaves of ``inputs`` in ``dtype``."""
    leaves = [t.detach().to(dtype or t.dtype).clone().requires_grad_() for t in inputs[:6]]
    s, out, loss = fn(*leaves, *inputs[6:])
    loss.backward()
    return [s.detach(), out.detach()] + [t.grad for t in leaves]


ADD_NORM_NAMES = ('sum', 'out', 'dx', 'dbranch', 'dnorm_weight', 'dnorm_bias', 'dweight', 'dbias')
# stochastic depth's factors: a dropped sample, a kept one (1 / keep rate), and more samples than factors of one
FACTORS = torch.tensor([0., 1.25, 1.25, 0.])


@pytest.mark.parametrize('shape', [(2, 7, 40), (4, 33, 24), (3, 130), (2, 5, 3000)],
                         ids=lambda s: 'x'.join(map(str, s)))
@pytest.mark.parametrize('scaled', [False, True], ids=['sum', 'drop-path'])
@pytest.mark.parametrize('grad_sum', [True, False], ids=['sum-used', 'sum-unused'])
def test_add_layer_norm_linear_matches_the_library(shape, scaled, grad_sum):
    """fp32 within 1e-6 of the float64 library layers: the sum, the output and the gradients of x, the branch,
    the norm's parameters, the weight and the bias, in their dtypes and shapes; with a factor per sample
    (rows of one sample share it: 7, 33, 1 and 5 tokens) and with the sum used after the layer or not."""
    inputs = make_add_norm_inputs(shape, 17)
    scale = FACTORS[:shape[0]] if scaled else None
    actual = add_norm_results(add_norm('triton', scale, grad_sum), inputs)
    expected = add_norm_results(add_norm('torch', scale, grad_sum), inputs, torch.float64)
    for name, a, e in zip(ADD_NORM_NAMES, actual, expected):
        assert a.dtype == torch.float32 and a.shape == e.shape, name
        assert relative_error(a, e) <= 1e-6, f'{shape} {name}: {relative_error(a, e):.2e}'
    if scaled:  # a dropped sample: its branch gets no gradient, and its sum is x
        assert actual[3][0].abs().max() == 0 and torch.equal(actual[0][0], inputs[0][0])


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_add_layer_norm_linear_under_autocast(dtype):
    """As a model runs it under autocast: a float32 residual stream, a branch of the autocast dtype, float32
    parameters. The sum is float32 and has the library's bits (the branch's product rounded to its dtype first,
    as torch's multiplication of two tensors of that dtype); the rest within rounding of the library's path, in
    its dtypes; a sample's dropped branch has a zero gradient."""
    inputs = list(make_add_norm_inputs((3, 9, 64), 32))
    inputs[1] = inputs[1].to(dtype)
    scale = FACTORS[:3]
    results = []
    for impl in ('triton', 'torch'):
        leaves = [t.clone().requires_grad_() for t in inputs[:6]]
        with torch.autocast(DEVICE, dtype=dtype):
            s, out, loss = add_norm(impl, scale)(*leaves, *inputs[6:])
        loss.backward()
        results.append([s, out] + [t.grad for t in leaves])
    for name, a, e in zip(ADD_NORM_NAMES, *results):
        assert a.dtype == e.dtype, name
        assert relative_error(a, e) <= 1e-2, (name, relative_error(a, e))
    assert torch.equal(results[0][0], results[1][0])
    assert results[0][0].dtype == torch.float32 and results[0][1].dtype == dtype and results[0][3].dtype == dtype
    assert results[0][3][0].abs().max() == 0


def test_add_layer_norm_linear_only_some_gradients_and_what_it_keeps():
    """A frozen branch, a frozen residual stream, a frozen norm and linear layer; autograd keeps the sum (not the
    normalised rows), the parameters and the factors."""
    inputs = make_add_norm_inputs((3, 20), 8)
    scale = FACTORS[:3]
    expected = add_norm_results(add_norm('torch', scale), inputs, torch.float64)
    for frozen in ({1}, {0}, {2, 3, 4, 5}, {0, 1}):
        leaves = [t.clone().requires_grad_(i not in frozen) for i, t in enumerate(inputs[:6])]
        add_norm('triton', scale)(*leaves, *inputs[6:])[2].backward()
        for i, t in enumerate(leaves):
            assert (t.grad is None) == (i in frozen), (frozen, i)
            if t.grad is not None:
                assert relative_error(t.grad, expected[i + 2]) <= 1e-6, (frozen, i)
    leaves = [t.clone().requires_grad_() for t in make_add_norm_inputs((2, 64, 96), 24)[:6]]
    factors = FACTORS[:2].clone().to(DEVICE)
    kept = saved_bytes(lambda *args: add_layer_norm_linear(*args[:4], 1e-5, *args[4:], impl='triton', scale=factors),
                       *leaves)
    assert kept == leaves[0].nbytes + sum(t.nbytes for t in leaves[2:5]) + factors.nbytes


def test_add_layer_norm_linear_launches_one_kernel_each_way():
    """In a dry run for a GPU: one launch in place of the library's multiplication, addition and LayerNorm in the
    forward, and in the backward one launch (and the sum of its partial sums) in place of the LayerNorm's
    backward, the sum of the residual stream's two gradients and the multiplication by the factors."""
    inputs = make_add_norm_inputs((2, 64, 96), 24)
    counts = {}
    for impl in ('torch', 'triton'):
        leaves = [t.clone().requires_grad_() for t in inputs[:6]]
        with dry_run(H100) as launches:
            x, branch = leaves[0] * 2, leaves[1] * 2  # made by ops, as in the models
            with DispatchedOps() as forward:
                s, out = add_layer_norm_linear(x, branch, *leaves[2:4], 1e-5, *leaves[4:], impl=impl,
                                               scale=FACTORS[:2].to(DEVICE))
            forward_launches = len(launches)
            loss = (s * inputs[6]).sum() + (out * inputs[7]).sum()
            with DispatchedOps() as backward:
                loss.backward()
        counts[impl] = (forward.names, backward.names, forward_launches, len(launches) - forward_launches)
    torch_forward, torch_backward = counts['torch'][:2]
    assert {'mul', 'add', 'native_layer_norm'} <= set(torch_forward) and counts['torch'][2:] == (0, 0)
    assert counts['triton'][2:] == (1, 1), counts
    forward, backward = counts['triton'][:2]
    assert not {'mul', 'add', 'native_layer_norm'} & set(forward), forward
    assert not {'native_layer_norm_backward', 'add'} & set(backward), backward
    assert backward.count('mul') == torch_backward.count('mul') - 1, (backward, torch_backward)


@pytest.mark.parametrize('grad_sum', [True, False], ids=['stream-used', 'stream-unused'])
def test_add_layer_norm_linear_without_a_branch_returns_the_stream(grad_sum):
    """branch None: s is x itself (the residual stream going on past the LayerNorm), and the gradient it gets
    from the layers after it is added to the LayerNorm's by the kernel: fp32 within 1e-6 of the float64 library
    layers; in a dry run for a GPU the backward adds nothing (the library's autograd adds the two gradients)."""
    x, _, *rest = make_add_norm_inputs((3, 9, 40), 17)
    inputs = (x, None, *rest)
    results = []
    for impl, dtype in (('triton', None), ('torch', torch.float64)):
        leaves = [t.detach().to(dtype or t.dtype).clone().requires_grad_() for t in (inputs[0], *inputs[2:6])]
        s, out = add_layer_norm_linear(leaves[0], None, *leaves[1:3], 1e-5, *leaves[3:], impl=impl)
        assert s.shape == x.shape and (impl == 'torch') == (s is leaves[0])
        loss = (out * inputs[7].to(out.dtype)).sum() + ((s * inputs[6].to(s.dtype)).sum() if grad_sum else 0)
        loss.backward()
        results.append([s.detach(), out.detach()] + [t.grad for t in leaves])
    for a, e in zip(*results):
        assert a.dtype == torch.float32 and relative_error(a, e) <= 1e-6, relative_error(a, e)
    counts = {}
    for impl in ('torch', 'triton'):
        leaves = [t.clone().requires_grad_() for t in (inputs[0], *inputs[2:6])]
        with dry_run(H100) as launches:
            stream = leaves[0] * 2  # made by an op, as in the models
            s, out = add_layer_norm_linear(stream, None, *leaves[1:3], 1e-5, *leaves[3:], impl=impl)
            loss = (s * inputs[6]).sum() + (out * inputs[7]).sum()
            with DispatchedOps() as backward:
                loss.backward()
        counts[impl] = backward.kernels().count('add'), len(launches)
    assert counts['torch'] == (1, 0) and counts['triton'] == (0, 2), counts


def test_add_layer_norm_linear_errors():
    x, branch, norm_weight, norm_bias, weight, bias, _, _ = make_add_norm_inputs((2, 5, 16), 8)
    s, out = add_layer_norm_linear(x, branch, norm_weight, norm_bias, 1e-5, weight, bias)  # 'auto' on the CPU
    assert torch.equal(s, x + branch) and torch.equal(out, norm_library(x + branch, norm_weight, norm_bias, weight,
                                                                         bias))
    with pytest.raises(ValueError, match=r'add_layer_norm_linear expects a branch of the shape of x \(2, 5, 16\), '
                       r'got \(2, 5, 8\)'):
        add_layer_norm_linear(x, branch[..., :8], norm_weight, norm_bias, 1e-5, weight, bias)
    with pytest.raises(ValueError, match=r'expects a scale of shape \(2, \) \(one factor per sample\), got \(5,\)'):
        add_layer_norm_linear(x, branch, norm_weight, norm_bias, 1e-5, weight, bias, scale=torch.ones(5))
    with pytest.raises(ValueError, match=r'expects a norm weight and bias of \(16, \) and a weight \(out, 16\)'):
        add_layer_norm_linear(x, branch, norm_weight[:8], norm_bias, 1e-5, weight, bias)
    from mmpola.models.layers import norm_linear
    norm, linears = torch.nn.LayerNorm(16), (torch.nn.Linear(16, 8), torch.nn.Linear(16, 16))
    s, operands = norm_linear(norm, linears, x.cpu(), chunk=8, branch=branch.cpu(), repeat=(1, ))
    assert torch.equal(s, x.cpu() + branch.cpu()) and len(operands) == 4
    # one product of the layers' weights concatenated (the library's layers): the layer's own output to rounding
    assert relative_error(operands[0], linears[0](norm(s))) <= 1e-6 and operands[3] is operands[1]


def test_drop_path_scale_draws_timms_factors():
    """drop_path_scale gives the factors timm's DropPath multiplies by, from the same random numbers: x + the
    branch times them is x + DropPath(branch), bit for bit; None where DropPath passes the branch through."""
    from timm.layers import DropPath

    from mmpola.models.layers import drop_path_scale
    branch = torch.randn(16, 5, 8, dtype=torch.bfloat16)
    drop = DropPath(0.3).train()
    torch.manual_seed(3)
    expected = drop(branch)
    torch.manual_seed(3)
    scale = drop_path_scale(drop, branch)
    assert scale.shape == (16, ) and scale.dtype == torch.bfloat16 and 0 < int((scale == 0).sum()) < 16
    assert torch.equal(branch * scale.view(-1, 1, 1), expected)
    assert drop_path_scale(drop.eval(), branch) is None and drop_path_scale(DropPath(0.).train(), branch) is None
    assert drop_path_scale(torch.nn.Identity(), branch) is None and drop_path_scale(None, branch) is None
    with pytest.raises(TypeError, match="drop_path_scale takes timm's DropPath or an nn.Identity, got Dropout"):
        drop_path_scale(torch.nn.Dropout(0.1), branch)


@pytest.mark.parametrize('module', ['block', 'conv_block', 'cswin'])
def test_blocks_add_the_attention_in_the_mlps_norm(monkeypatch, module):
    """In training with stochastic depth, the blocks' residual connection of the attention goes to the MLP's
    LayerNorm kernel with MMPOLA_RECOMPUTE=triton (PVT's, Swin's and the ViT's block, PVTv2's MLP with its
    depthwise conv, CSWin's block): the same random draws, the library's output and gradients, and one
    addition and one multiplication by the drop-path factors fewer each way."""
    from mmpola.models import CSWinBackbone
    from mmpola.models.attention.softmax import SpatialReductionAttention
    from tests.fixtures.backbones import MINI_CSWIN
    hw, dim = (5, 6), 24
    torch.manual_seed(0)
    if module == 'cswin':
        layer = CSWinBackbone(arch=MINI_CSWIN, attn='flatten', attn_type='LLLL', drop_path_rate=0.5).stage2[0]
        dim = layer.dim
    else:
        layer = PreNormBlock(dim, SpatialReductionAttention(dim, 2), drop_path=0.5,
                             mlp_layer=Mlp if module == 'block' else ConvMlp)
    assert type(layer.drop_path).__name__ == 'DropPath'
    layer = layer.to(DEVICE).train()
    x = torch.randn(4, 30, dim, device=DEVICE, requires_grad=True)
    results, ops = [], []
    for impl in ('torch', 'triton'):
        monkeypatch.setenv('MMPOLA_RECOMPUTE', impl)
        layer.zero_grad()
        x.grad = None
        torch.manual_seed(1)
        with DispatchedOps() as forward:
            out = layer(x, hw)
        with DispatchedOps() as backward:
            out.square().sum().backward()
        ops.append([sum(1 for name, shape in zip(o.names, o.shapes) if name == op and shape == x.shape)
                    for o in (forward, backward) for op in ('add', 'mul')])
        results.append([out.detach(), x.grad.clone()] + [p.grad.clone() for p in layer.parameters()])
    for a, e in zip(*results):
        assert relative_error(a, e) <= 1e-5, relative_error(a, e)
    assert [library - kernel for library, kernel in zip(*ops)] == [1, 1, 1, 1], ops


@pytest.mark.parametrize('attention', ['pola', 'pola_pvt', 'flatten', 'inline', 'softmax'])
def test_blocks_hand_their_residual_connection_to_the_next_blocks_norm(monkeypatch, attention):
    """run_blocks: a block hands the MLP's residual connection to the next block, whose attention adds it with
    the LayerNorm before its projections (Pola's and FLatten's, which take that norm): with stochastic depth in
    training, the output and gradients of the blocks called one after another, with MMPOLA_RECOMPUTE=torch and
    =triton; with =triton one addition and one multiplication by the drop-path factors fewer in the forward per
    pair of blocks and one multiplication in the backward, where no block adds the residual stream's gradients
    (a block's first LayerNorm's kernel adds the gradient of its input from the rest of the block, handed or
    not: ``stream``). Attentions that do not take the norm (InLine, the softmax kinds) add it at the block's start. A
    forward hook on a block, and gradient checkpointing, keep the blocks' usual outputs."""
    from mmpola.models.attention.flatten import FocusedLinearAttention
    from mmpola.models.attention.inline import InLineAttention
    from mmpola.models.attention.pola import PolaAttention
    from mmpola.models.attention.softmax import SpatialReductionAttention
    from mmpola.models.backbones import run_blocks
    hw, dim = (5, 6), 24
    makers = {'pola': lambda: PolaAttention(dim, 2, hw), 'flatten': lambda: FocusedLinearAttention(dim, 2, hw),
              'pola_pvt': lambda: PolaAttention(dim, 2, hw, qkv_layout='separate'),
              'inline': lambda: InLineAttention(dim, 2), 'softmax': lambda: SpatialReductionAttention(dim, 2)}
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList([PreNormBlock(dim, makers[attention](), drop_path=0.5) for _ in range(3)])
    blocks = blocks.to(DEVICE).train()
    takes = attention in ('pola', 'pola_pvt', 'flatten')
    assert [b.takes_residual for b in blocks] == [takes] * 3
    x = torch.randn(4, 30, dim, device=DEVICE, requires_grad=True)
    seen = []

    def run(impl, how):
        monkeypatch.setenv('MMPOLA_RECOMPUTE', impl)
        blocks.zero_grad()
        x.grad = None
        torch.manual_seed(1)
        handles = [blocks[1].register_forward_hook(lambda m, a, out: seen.append(out))] if how == 'hooked' else []
        with DispatchedOps() as forward:
            if how == 'one_by_one':
                out = x
                for block in blocks:
                    out = block(out, hw)
            else:
                out = run_blocks(blocks, x, hw, with_cp=how == 'checkpointed')
        with DispatchedOps() as backward:
            out.square().sum().backward()
        for handle in handles:
            handle.remove()
        counts = [sum(1 for name, shape in zip(o.names, o.shapes) if name == op and shape == x.shape)
                  for o in (forward, backward) for op in ('add', 'mul')]
        return [out.detach(), x.grad.clone()] + [p.grad.clone() for p in blocks.parameters()], counts

    def fewer(impl, how):  # the backward's additions of the stream's gradients: none either way where the
        handed = 2 if takes and impl == 'triton' and how == 'run_blocks' else 0  # norm's kernel adds them
        return [handed, handed, 0, handed]  # (two pairs of blocks)

    counts = compare_block_runs(run, fewer)
    for how in ('run_blocks', 'hooked'):
        if attention in ('pola', 'pola_pvt'):  # (FLatten's focused maps' backward adds gradients of the
            assert counts['triton', how][2] == 0, (how, counts)  # operands' shape, x's)
    assert len(seen) == 1 and isinstance(seen[0], torch.Tensor)  # the hooked block's usual output


def compare_block_runs(run, fewer):
    """``run(impl, how)`` -> (results, operator counts) of blocks run with MMPOLA_RECOMPUTE=impl, one by one or
    through run_blocks (also with a hooked block and checkpointed): every run's results within 1e-5 of the
    library's blocks one by one, and its counts ``fewer(impl, how)`` below those of the blocks one by one with
    the same implementation (not checkpointed: its backward runs the forward again). Returns the counts of
    each (impl, how)."""
    expected, one_by_one = run('torch', 'one_by_one')
    one_by_one = {'torch': one_by_one, 'triton': run('triton', 'one_by_one')[1]}
    counts = {}
    for impl, how in (('torch', 'run_blocks'), ('triton', 'run_blocks'), ('triton', 'hooked'),
                      ('triton', 'checkpointed')):
        results, counts[impl, how] = run(impl, how)
        for a, e in zip(results, expected):
            assert max_scaled_error(a, e) <= 1e-5, (impl, how, max_scaled_error(a, e))
        if how != 'checkpointed':
            assert [o - c for o, c in zip(one_by_one[impl], counts[impl, how])] == fewer(impl, how), (
                impl, how, one_by_one, counts)
    return counts


def residual_cast_results(impl, x, branch, scale, dtype, grads):
    """(s, copy, x's gradient, the branch's) of add_residual_and_cast, for the gradients ``grads`` of s and the
    copy (either None: not used)."""
    x, branch = x.clone().requires_grad_(), branch.clone().requires_grad_()
    s, copy = add_residual_and_cast(x, branch, dtype, scale, impl)
    used = [(out, g) for out, g in zip((s, copy), grads) if g is not None]
    torch.autograd.backward([out for out, _ in used], [g for _, g in used])
    return [s.detach(), copy.detach(), x.grad, branch.grad]


@pytest.mark.parametrize('branch_dtype', [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize('scaled', [False, True], ids=['sum', 'drop-path'])
@pytest.mark.parametrize('used', ['both', 'sum', 'copy'])
def test_add_residual_and_cast_matches_the_library(branch_dtype, scaled, used):
    """A float32 residual stream and a branch of the autocast dtype (or float32), the sum copied to bfloat16:
    the sum, the copy and both gradients have the library's values bit for bit (one addition, one product by
    the factor rounded to the branch's dtype, one rounding of each gradient, as torch's element-wise operators
    give them) and dtypes, with the sum, the copy or both used after it (4 samples of 33 tokens, more elements
    than a program's block); a dropped sample's branch gets no gradient."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 33, 24, generator=g).to(DEVICE)
    branch = torch.randn(4, 33, 24, generator=g).to(DEVICE, branch_dtype)
    scale = FACTORS.to(DEVICE, branch_dtype) if scaled else None
    grads = [torch.randn(4, 33, 24, generator=g).to(DEVICE, dtype) if used in (name, 'both') else None
             for name, dtype in (('sum', torch.float32), ('copy', torch.bfloat16))]
    actual = residual_cast_results('triton', x, branch, scale, torch.bfloat16, grads)
    expected = residual_cast_results('torch', x, branch, scale, torch.bfloat16, grads)
    for name, a, e in zip(('sum', 'copy', 'grad x', 'grad branch'), actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape, name
        assert torch.equal(a, e), (name, (a.double() - e.double()).abs().max().item())
    if scaled:
        assert actual[3][0].abs().max() == 0 and torch.equal(actual[0][0], x[0])


@pytest.mark.parametrize('grad_layout', ['map', 'tokens', 'other'])
def test_add_residual_and_cast_writes_the_sum_as_a_map(grad_layout):
    """as_map: the kernel writes the sum in the layout of its (B, C, H, W) map and returns that map's tokens view,
    whose map (reshape and permute) is contiguous, the same storage; the values and gradients are the library's
    bit for bit, with the sum's gradient given as the map's (read in place), as contiguous tokens, or strided
    otherwise (copied first)."""
    B, H, W, C = 3, 5, 7, 40
    g = torch.Generator().manual_seed(2)
    x = torch.randn(B, H * W, C, generator=g).to(DEVICE)
    branch = torch.randn(B, H * W, C, generator=g).to(DEVICE, torch.bfloat16)
    grad_map = torch.randn(B, C, H, W, generator=g).to(DEVICE)
    grad_s = {'map': grad_map.flatten(2).transpose(1, 2), 'tokens': grad_map.flatten(2).transpose(1, 2).contiguous(),
              'other': grad_map.permute(0, 3, 2, 1).contiguous().permute(0, 3, 2, 1).flatten(2).transpose(1, 2)}[
                  grad_layout]
    grad_copy = torch.randn(B, H * W, C, generator=g).to(DEVICE, torch.bfloat16)
    scale = FACTORS[:B].to(DEVICE, torch.bfloat16)
    results = []
    for impl in ('triton', 'torch'):
        leaves = [t.clone().requires_grad_() for t in (x, branch)]
        s, copy = add_residual_and_cast(*leaves, torch.bfloat16, scale, impl, as_map=True)
        if impl == 'triton':
            assert s.stride() == (C * H * W, 1, H * W) and copy.is_contiguous()
            as_map = s.reshape(B, H, W, C).permute(0, 3, 1, 2)
            assert as_map.is_contiguous() and as_map.data_ptr() == s.data_ptr()
        torch.autograd.backward([s, copy], [grad_s, grad_copy])
        results.append([s.detach(), copy, leaves[0].grad, leaves[1].grad])
    for a, e in zip(*results):
        assert a.dtype == e.dtype and torch.equal(a, e), (a - e).abs().max()
    with pytest.raises(ValueError, match=r'writes the sum as a map for tokens \(B, N, C\), got \(3, 5, 7, 40\)'):
        add_residual_and_cast(x.view(B, H, W, C), x.view(B, H, W, C), torch.bfloat16, as_map=True)


def test_add_residual_and_cast_in_float64_and_what_it_keeps():
    """float64 inputs (computed in float32, as every kernel here) within 1e-6 of the library's; x frozen or the
    branch frozen; autograd keeps the factors only."""
    g = torch.Generator().manual_seed(1)
    x, branch, grad_s = (torch.randn(3, 7, 40, generator=g, dtype=torch.float64).to(DEVICE) for _ in range(3))
    grad_copy = torch.randn(3, 7, 40, generator=g).to(DEVICE)
    scale = FACTORS[:3].to(DEVICE, torch.float64)
    actual = residual_cast_results('triton', x, branch, scale, torch.float32, (grad_s, grad_copy))
    expected = residual_cast_results('torch', x, branch, scale, torch.float32, (grad_s, grad_copy))
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and relative_error(a, e) <= 1e-6, relative_error(a, e)
    for frozen in (0, 1):
        leaves = [t.clone().requires_grad_(i != frozen) for i, t in enumerate((x, branch))]
        s, copy = add_residual_and_cast(*leaves, torch.float32, scale, 'triton')
        (s * grad_s + copy * grad_copy).sum().backward()
        assert leaves[frozen].grad is None
        assert relative_error(leaves[1 - frozen].grad, expected[2 + 1 - frozen]) <= 1e-6
    leaves = [t.clone().requires_grad_() for t in (x, branch)]
    assert saved_bytes(lambda *a: add_residual_and_cast(*a, torch.float32, scale, 'triton'), *leaves) == scale.nbytes


def test_add_residual_and_cast_launches_one_kernel_each_way():
    """In a dry run for a GPU, one launch each way: in the forward in place of the library's multiplication by the
    factors, addition and cast; in the backward in place of the cast of the copy's gradient, the sum of the two
    gradients, and the branch's cast and multiplication. 'auto' on the CPU: the library's operators."""
    x = torch.randn(2, 64, 96, device=DEVICE, requires_grad=True)
    branch = torch.randn(2, 64, 96, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    scale = FACTORS[:2].to(DEVICE, torch.bfloat16)
    counts = {}
    for impl in ('torch', 'triton'):
        with dry_run(H100) as launches:
            stream, mlp = x * 2, branch * 2  # made by ops, as in the models
            with DispatchedOps() as forward:
                s, copy = add_residual_and_cast(stream, mlp, torch.bfloat16, scale, impl)
            forward_launches = len(launches)
            loss = s.sum() + copy.float().sum()
            with DispatchedOps() as backward:
                loss.backward()
        counts[impl] = (forward.kernels(), backward.kernels(), forward_launches, len(launches) - forward_launches)
    torch_forward, torch_backward = counts['torch'][:2]
    assert {'mul', 'add', '_to_copy'} <= set(torch_forward) and counts['torch'][2:] == (0, 0)
    assert {'mul', 'add', '_to_copy'} <= set(torch_backward)
    assert counts['triton'][2:] == (1, 1), counts
    forward, backward = counts['triton'][:2]
    assert not {'mul', 'add', '_to_copy'} & set(forward), forward
    # the backward: the loss's and the inputs' operators are both sides'
    assert [torch_backward.count(op) - backward.count(op) for op in ('mul', 'add', '_to_copy')] == [1, 1, 2], (
        backward, torch_backward)
    with torch.no_grad():
        s, copy = add_residual_and_cast(x, branch, torch.bfloat16, scale)  # 'auto': the library on the CPU
    if DEVICE == 'cpu':
        assert torch.equal(s, x + branch * scale.view(-1, 1, 1)) and torch.equal(copy, s.to(torch.bfloat16))


def test_add_residual_and_cast_errors(monkeypatch):
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match=r'add_residual_and_cast expects a branch of the shape of x \(2, 5, 16\), '
                       r'got \(2, 5, 8\)'):
        add_residual_and_cast(x, x[..., :8], torch.bfloat16)
    with pytest.raises(ValueError, match=r'expects a scale of shape \(2, \) \(one factor per sample\), got \(5,\)'):
        add_residual_and_cast(x, x, torch.bfloat16, torch.ones(5))
    kernels_compiled(monkeypatch)
    if not torch.cuda.is_available():
        with pytest.raises(AttnImplUnavailable, match=r"add_residual_and_cast cannot run here: .*; use impl='torch' "
                           r"\(MMPOLA_RECOMPUTE=torch\)"):
            add_residual_and_cast(x, x, torch.bfloat16, impl='triton')


@pytest.mark.parametrize('attention', ['pola_pvt', 'softmax'])
def test_the_last_block_writes_the_sum_and_its_copy(monkeypatch, attention):
    """run_blocks(..., cast=dtype): the blocks' output and its copy in dtype (the output's bits rounded), as the
    blocks called one after another and a cast; with MMPOLA_RECOMPUTE=triton the last block hands its residual
    connection to add_and_cast, whose kernel writes both (one addition, one multiplication by the drop-path
    factors and one cast fewer in the forward, besides the pair's residual connection that Pola's norm adds);
    with the gradients of both used, the same gradients. A forward hook on the last block and gradient
    checkpointing keep the blocks' usual outputs, and the cast after them."""
    from mmpola.models.attention.pola import PolaAttention
    from mmpola.models.attention.softmax import SpatialReductionAttention
    from mmpola.models.backbones import run_blocks
    hw, dim = (5, 6), 24
    makers = {'pola_pvt': lambda: PolaAttention(dim, 2, hw, qkv_layout='separate'),
              'softmax': lambda: SpatialReductionAttention(dim, 2)}
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList([PreNormBlock(dim, makers[attention](), drop_path=0.5) for _ in range(2)])
    blocks = blocks.to(DEVICE).train()
    x = torch.randn(4, 30, dim, device=DEVICE, requires_grad=True)
    grad_copy = torch.randn(4, 30, dim, device=DEVICE).to(torch.bfloat16)

    def run(impl, how):
        monkeypatch.setenv('MMPOLA_RECOMPUTE', impl)
        blocks.zero_grad()
        x.grad = None
        torch.manual_seed(1)
        handles = [blocks[1].register_forward_hook(lambda m, a, out: None)] if how == 'hooked' else []
        with DispatchedOps() as forward:
            if how == 'one_by_one':
                out = x
                for block in blocks:
                    out = block(out, hw)
                copy = out.to(torch.bfloat16)
            else:
                out, copy = run_blocks(blocks, x, hw, with_cp=how == 'checkpointed', cast=torch.bfloat16)
        assert out.dtype == torch.float32 and torch.equal(copy, out.to(torch.bfloat16))
        torch.autograd.backward([out.square().sum(), copy], [None, grad_copy])
        for handle in handles:
            handle.remove()
        counts = [sum(1 for name, shape in zip(forward.names, forward.shapes) if name == op and shape == x.shape)
                  for op in ('add', 'mul', '_to_copy')]
        return [out.detach(), x.grad.clone()] + [p.grad.clone() for p in blocks.parameters()], counts

    def fewer(impl, how):
        fused = 1 if impl == 'triton' and how == 'run_blocks' else 0
        handed = fused if attention == 'pola_pvt' else 0  # the first block's residual connection to the second's
        return [fused + handed] * 2 + [fused]

    compare_block_runs(run, fewer)



def norm_add_inputs(layout, dtype=torch.float32, B=2, C=40, hw=(5, 7), seed=0):
    """A convolution's output map (B, C, H, W) in ``layout`` ('nchw' or channels-last 'nhwc') and the norm's
    weight, bias, a positional encoding (1, H*W, C) and a gradient of the output (B, H*W, C)."""
    g = torch.Generator().manual_seed(seed)
    maps = torch.randn(B, C, *hw, generator=g) * 3 + 1
    if layout == 'nhwc':
        maps = maps.contiguous(memory_format=torch.channels_last)
    weight, bias = torch.randn(C, generator=g), torch.randn(C, generator=g)
    encoding = torch.randn(1, hw[0] * hw[1], C, generator=g)
    grad = torch.randn(B, hw[0] * hw[1], C, generator=g)
    return [t.to(DEVICE) for t in (maps.to(dtype), weight, bias, encoding, grad)]


def norm_add_results(impl, maps, weight, bias, encoding, grad, autocast=None):
    """The output and the gradients of the map, weight, bias and encoding of ``layer_norm_add`` of the map's
    tokens (the library's layers for ``impl`` 'library', in float32 as autocast runs a LayerNorm on CUDA)."""
    leaves = [t.detach().requires_grad_() for t in (maps, weight, bias, encoding)]
    tokens = leaves[0].flatten(2).transpose(1, 2)
    with torch.autocast(maps.device.type, autocast, enabled=autocast is not None):
        if impl == 'library':
            out = F.layer_norm(tokens.float() if autocast else tokens, (tokens.shape[-1], ), *leaves[1:3], 1e-5)
            out = out + leaves[3]
        else:
            out = layer_norm_add(tokens, *leaves[1:3], 1e-5, leaves[3], impl)
    return [out, *torch.autograd.grad(out, leaves, grad.to(out.dtype))]


@pytest.mark.parametrize('layout', ['nchw', 'nhwc'])
@pytest.mark.parametrize('hw', [(5, 7), (1, 1), (33, 65)], ids=lambda s: f'{s[0]}x{s[1]}')
def test_layer_norm_add_matches_the_library(layout, hw):
    """float32 maps in either layout within 1e-6 of the float64 library (output, the map's gradient, the
    encoding's) and 1e-5 (the norm's parameters', sums over every token); the map's gradient in the map's
    layout."""
    inputs = norm_add_inputs(layout, hw=hw)
    actual = norm_add_results('triton', *inputs)
    expected = norm_add_results('library', *[t.double() for t in inputs])
    for name, a, e, tol in zip(('out', 'dmap', 'dweight', 'dbias', 'dencoding'), actual, expected,
                               (1e-6, 1e-6, 1e-5, 1e-5, 1e-6)):
        assert a.dtype == torch.float32 and a.shape == e.shape, name
        assert relative_error(a, e) <= tol, f'{name}: {relative_error(a, e):.2e}'
    assert actual[0].is_contiguous() and actual[1].stride() == inputs[0].stride()


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_layer_norm_add_under_autocast(dtype):
    """A half-precision map (the convolution's output under autocast): the output in float32, normalised in
    float32 as autocast runs a LayerNorm on CUDA (within 1e-6 of the library doing so), the map's gradient in its
    dtype and layout (within its rounding), the others float32 as the library's."""
    inputs = norm_add_inputs('nchw', dtype)
    actual = norm_add_results('triton', *inputs, autocast=dtype)
    expected = norm_add_results('library', *inputs, autocast=dtype)
    assert [t.dtype for t in actual] == [torch.float32, dtype, torch.float32, torch.float32, torch.float32]
    assert [t.dtype for t in expected] == [t.dtype for t in actual]
    assert relative_error(actual[0], expected[0]) <= 1e-6
    assert relative_error(actual[1], expected[1]) <= 2 * torch.finfo(dtype).eps
    for a, e in zip(actual[2:], expected[2:]):
        assert relative_error(a, e) <= 1e-5
    assert actual[1].stride() == inputs[0].stride()


def test_layer_norm_add_only_some_gradients_and_what_it_keeps():
    """A frozen norm (the encoding's gradient only), a frozen encoding; the backward keeps the map and the norm's
    parameters only (not the normalised tokens, nor the encoding)."""
    maps, weight, bias, encoding, grad = norm_add_inputs('nchw')
    encoding.requires_grad_()
    out = layer_norm_add(maps.flatten(2).transpose(1, 2), weight, bias, 1e-5, encoding, 'triton')
    (d_encoding, ) = torch.autograd.grad(out, encoding, grad)
    assert torch.allclose(d_encoding, grad.sum(0, keepdim=True), rtol=1e-6, atol=1e-6)
    maps.requires_grad_()
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        out = layer_norm_add(maps.flatten(2).transpose(1, 2), weight, bias, 1e-5, encoding.detach(), 'triton')
    assert {t.data_ptr() for t in kept} == {maps.data_ptr(), weight.data_ptr(), bias.data_ptr()}
    expected = norm_add_results('library', maps, weight, bias, encoding, grad)[1]
    assert relative_error(torch.autograd.grad(out, maps, grad)[0], expected) <= 1e-6


def test_layer_norm_add_launches_one_kernel_each_way():
    """In a dry run for a GPU, one launch each way: in the forward in place of the library's LayerNorm and
    addition; in the backward in place of the LayerNorm's backward (the sum of its partial sums after it), the
    encoding's gradient the sum over the samples as the library's. 'auto' on the CPU: the library's operators."""
    maps, weight, bias, encoding, grad = norm_add_inputs('nchw')
    for t in (maps, weight, bias, encoding):
        t.requires_grad_()
    counts = {}
    for impl in ('torch', 'triton'):
        with dry_run(H100) as launches:
            with DispatchedOps() as forward:
                out = layer_norm_add(maps.flatten(2).transpose(1, 2), weight, bias, 1e-5, encoding, impl)
            forward_launches = len(launches)
            with DispatchedOps() as backward:
                out.backward(grad)
        counts[impl] = (forward.kernels(), backward.kernels(), forward_launches, len(launches) - forward_launches)
    assert counts['torch'][:1] == (['native_layer_norm', 'add'], ) and counts['torch'][2:] == (0, 0), counts
    assert counts['triton'][0] == [] and counts['triton'][2:] == (1, 1), counts
    assert 'native_layer_norm_backward' in counts['torch'][1], counts
    assert counts['triton'][1].count('sum') == 2 and 'native_layer_norm_backward' not in counts['triton'][1], counts
    with torch.no_grad():
        out = layer_norm_add(maps.flatten(2).transpose(1, 2), weight, bias, 1e-5, encoding)
    if DEVICE == 'cpu':  # 'auto': the library
        expected = F.layer_norm(maps.flatten(2).transpose(1, 2), (40, ), weight, bias, 1e-5) + encoding
        assert torch.equal(out, expected)


def test_layer_norm_add_errors(monkeypatch):
    maps, weight, bias, encoding, _ = norm_add_inputs('nchw')
    tokens = maps.flatten(2).transpose(1, 2)
    with pytest.raises(ValueError, match=r'tokens \(B, N, C\), got \(2, 40, 5, 7\)'):
        layer_norm_add(maps, weight, bias, 1e-5, encoding, 'triton')
    with pytest.raises(ValueError, match=r'weight and bias must be \(40, \) for 40 channels, got \(39,\)'):
        layer_norm_add(tokens, weight[:39], bias, 1e-5, encoding, 'triton')
    with pytest.raises(ValueError, match=r'one row of 40 channels per token \(35, 40\), got \(1, 34, 40\)'):
        layer_norm_add(tokens, weight, bias, 1e-5, encoding[:, :34], 'triton')
    if DEVICE == 'cpu':
        kernels_compiled(monkeypatch)
        with pytest.raises(AttnImplUnavailable, match='layer_norm_add cannot run here.*MMPOLA_RECOMPUTE=torch'):
            layer_norm_add(tokens, weight, bias, 1e-5, encoding, 'triton')


def test_row_blocks_are_the_gpus_in_a_dry_run_and_larger_in_the_interpreter(monkeypatch):
    """The GELU's (and the operands') and the LayerNorm's kernels take row blocks of 1024 and 2048 elements in a dry
    run for a GPU, what a GPU runs, and ``_INTERPRETER_ROWS`` times the rows where Triton's interpreter runs them
    (its time goes per program and per operation)."""
    from mmpola.ops import recompute_triton, triton_support
    h, weight, bias, grad = make_inputs((4, 2049), 24)
    seen = []
    if DEVICE == 'cpu':
        real = triton_support._launch
        monkeypatch.setattr(triton_support, '_launch', lambda kernel, grid, args, kwargs, default: (
            seen.append(kwargs['BLOCK_M']) or real(kernel, grid, args, kwargs, default)))
    *norm_leaves, norm_grad = make_norm_inputs((4, 2049, 24), 17)
    for target in (H100, None):
        with (dry_run(target) if target else contextlib.nullcontext()) as launches:
            forward_backward(triton_path, [h, weight, bias], grad)
            forward_backward(norm_triton, norm_leaves, norm_grad)
        if target:  # the GELU's backward (64 columns a block); the LayerNorm's forward and backward (32 columns)
            assert [launch.kwargs['BLOCK_M'] for launch in launches] == [1024 // 64, 2048 // 32, 2048 // 32]
    if DEVICE == 'cpu':
        assert seen == [recompute_triton._INTERPRETER_ROWS * rows for rows in (1024 // 64, 2048 // 32, 2048 // 32)]


MULTI_BLOCK_CASES = {  # the tests above at sizes of several of a GPU's row blocks, and of programs summing them
    'gelu': lambda: test_triton_matches_the_library((4, 2049)),
    'gelu-input-bias': lambda: test_input_bias_matches_the_library((3000, 40)),
    'norm-linear': lambda: test_layer_norm_linear_matches_the_library((4, 2049, 24)),
    'norm-operands': lambda: test_layer_norm_linear_operands_match_the_library(OPERAND_CASES[1]),
    'add-norm-linear': lambda: test_add_layer_norm_linear_matches_the_library((4, 33, 24), True, True),
    'norm-add': lambda: test_layer_norm_add_matches_the_library('nhwc', (33, 65)),
}


@pytest.mark.skipif(DEVICE != 'cpu', reason="a GPU runs its own row blocks in every test")
@pytest.mark.parametrize('case', list(MULTI_BLOCK_CASES))
def test_the_gpus_row_blocks_in_the_interpreter(monkeypatch, case):
    """The interpreter running the row blocks that a GPU runs (the tests above run larger ones there): the same
    results within the same tolerances, with the masked tails and the programs' shares of the row blocks of a
    GPU's launch."""
    from mmpola.ops import recompute_triton
    monkeypatch.setattr(recompute_triton, '_INTERPRETER_ROWS', 1)
    MULTI_BLOCK_CASES[case]()


@pytest.mark.parametrize('hooked', [False, True])
def test_patch_embedding_adds_the_encoding_in_the_norms_kernel(monkeypatch, hooked):
    """PatchEmbed.embed_and_add: where the kernels run, the norm's kernel adds the encoding (no LayerNorm, no
    addition dispatched); with a forward hook on the norm, the modules and the library's addition (the hook sees
    the norm's tokens). Both equal the modules' output within 1e-6, with their gradients."""
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'triton')
    torch.manual_seed(0)
    embed = PatchEmbed(3, 32, 4).to(DEVICE)
    image = torch.randn(2, 3, 24, 36, device=DEVICE)
    encoding = torch.randn(1, 6 * 9, 32, device=DEVICE, requires_grad=True)
    seen = []
    if hooked:
        embed.norm.register_forward_hook(lambda module, args, out: seen.append(out))
    with DispatchedOps() as ops:
        out, hw = embed.embed_and_add(image, lambda hw: encoding)
    assert hw == (6, 9) and out.shape == (2, 54, 32)
    assert ('native_layer_norm' in ops.names) == hooked and ('add' in ops.names) == hooked
    assert len(seen) == int(hooked)
    leaves = [encoding, *embed.parameters()]
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)  # (a uniform one: none)
    grads = torch.autograd.grad(out, leaves, grad)
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'torch')
    tokens, _ = embed(image)
    expected = tokens + encoding
    expected_grads = torch.autograd.grad(expected, leaves, grad)
    assert relative_error(out, expected) <= 1e-6
    for a, e in zip(grads, expected_grads):
        assert relative_error(a, e) <= 1e-5
