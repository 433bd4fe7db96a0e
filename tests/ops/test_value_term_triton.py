"""Pola's and FLatten's attention cores joined with their depthwise value term, and InLine's with its local residual,
in one autograd Function (mmpola.ops.value_term_triton): bit for bit the two ops called apart, the operands'
checks, and where the joined Function applies. Without a GPU the kernels run through Triton's interpreter
(tests/conftest.py sets TRITON_INTERPRET=1)."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mmpola.ops.depthwise_triton import depthwise_conv2d_triton
from mmpola.ops.flatten_triton import flatten_attention_triton
from mmpola.ops.inline_triton import inline_attention_triton
from mmpola.ops.pola_triton import pola_attention_triton
from mmpola.ops.value_term_triton import (
    flatten_value_term_triton,
    inline_value_term_triton,
    pacs_value_term_triton,
    pola_value_term_triton,
    tokens_view,
    value_term_joins,
)

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
OPS = ('pola', 'flatten')


def _inputs(op, B, heads, hw, d, dtype, seed=0, kernel=5):
    """Token-layout operands as views of one projection (q, k, v, v_term: v_term a view of its own of v's
    channels), the raw parameters (Pola: scale and power; FLatten: scale), a key encoding in the keys' dtype and
    the depthwise conv's weight and bias; and the output's gradient."""
    g = torch.Generator().manual_seed(seed)
    N, C = hw[0] * hw[1], heads * d
    projection = torch.randn(B, N, 4 * C, generator=g)
    scale = torch.randn(1, 1, C, generator=g) * 0.3
    power = torch.randn(1, heads, 1, d, generator=g) * 0.5
    encoding = torch.randn(1, N, C, generator=g) * 0.5
    weight = torch.randn(d, 1, kernel, kernel, generator=g) * 0.2
    bias = torch.randn(d, generator=g) * 0.1
    params = [scale.to(DEVICE), power.to(DEVICE)] if op == 'pola' else [scale.to(DEVICE)]
    leaves = [projection.to(DEVICE, dtype), *params, encoding.to(DEVICE, dtype), weight.to(DEVICE), bias.to(DEVICE)]
    return [t.requires_grad_() for t in leaves], torch.randn(B, N, C, generator=g).to(DEVICE, dtype)


def _autocast(dtype):
    """Autocast to ``dtype`` on the tests' device, where it is not float32."""
    return torch.autocast(torch.device(DEVICE).type, dtype, enabled=dtype != torch.float32)


class Operators(TorchDispatchMode):
    """A context that records the names of the aten operators dispatched inside (``names``)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__.split('.')[0])
        return func(*args, **(kwargs or {}))


def _split(projection, C):
    q, k, v, _ = projection.unflatten(-1, (4, C)).unbind(-2)
    return q, k, v, v.view_as(v)


def _joined(op, leaves, hw, heads, with_bias=True, with_conv_bias=True):
    projection, *params, encoding, weight, bias = leaves
    q, k, v, v_term = _split(projection, params[0].shape[-1])
    conv_bias, key_bias = bias if with_conv_bias else None, encoding if with_bias else None
    if op == 'pola':
        scale, power = params
        return pola_value_term_triton(q, k, v, v_term, power, scale, weight, conv_bias, hw, key_bias=key_bias)
    return flatten_value_term_triton(q, k, v, v_term, params[0], heads, weight, conv_bias, hw, key_bias=key_bias)


def _apart(op, leaves, hw, heads, with_bias=True, with_conv_bias=True):
    """What the attention modules run without the joined Function: the core (Pola: on head views; FLatten: on the
    tokens), then the conv of the values' maps with the core's output as its residual, the heads merged."""
    projection, *params, encoding, weight, bias = leaves
    B, N, C = projection.shape[0], projection.shape[1], params[0].shape[-1]
    d = C // heads

    def split(t):
        return t.reshape(t.shape[0], t.shape[1], heads, d).transpose(1, 2)

    q, k, v, v_term = _split(projection, C)
    if op == 'pola':
        scale, power = params
        out = pola_attention_triton(split(q), split(k), split(v), power, split(scale),
                                    key_bias=split(encoding) if with_bias else None)
    else:
        out = split(flatten_attention_triton(q, k, v, params[0], heads, key_bias=encoding if with_bias else None))

    def maps(t):
        return t.unflatten(2, hw).permute(0, 1, 4, 2, 3)

    conv_weight = weight.view(d, *weight.shape[2:], 1).permute(0, 3, 1, 2)  # as DepthwiseConv2d passes it
    with _autocast(projection.dtype):  # as the modules run it: the float32 weights read as they are
        total = depthwise_conv2d_triton(maps(split(v_term)), conv_weight, bias if with_conv_bias else None,
                                        residual=maps(out))
    return total.permute(0, 1, 3, 4, 2).reshape(B, heads, N, d).transpose(1, 2).reshape(B, N, C)


def _forward_backward(fn, op, leaves, grad, *args, **kwargs):
    for t in leaves:
        t.grad = None
    out = fn(op, leaves, *args, **kwargs)
    out.backward(grad)
    return [out.detach()] + [None if t.grad is None else t.grad.clone() for t in leaves]


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=['float32', 'bfloat16'])
@pytest.mark.parametrize('case', [(2, 2, (5, 7), 16, True, True), (1, 3, (4, 6), 8, False, False),
                                  (1, 1, (9, 5), 32, True, False)],
                         ids=['B2-h2-5x7-d16', 'h3-no-biases', 'h1-d32-no-conv-bias'])
@pytest.mark.parametrize('op', OPS)
def test_joined_function_gives_the_two_ops_results_bit_for_bit(op, case, dtype):
    """The output and every gradient (the projection's, with v's two uses added; the raw parameters', the
    encoding's, the conv's weight and bias) equal those of the core's Triton op followed by
    depthwise_conv2d_triton, in the same dtypes and strides (one head: FLatten's single-kernel backward)."""
    B, heads, hw, d, with_bias, with_conv_bias = case
    leaves, grad = _inputs(op, B, heads, hw, d, dtype)
    joined = _forward_backward(_joined, op, leaves, grad, hw, heads, with_bias, with_conv_bias)
    apart = _forward_backward(_apart, op, leaves, grad, hw, heads, with_bias, with_conv_bias)
    _assert_bit_for_bit(op, joined, apart)
    assert joined[0].dtype == dtype


def _assert_bit_for_bit(op, got, expected):
    """The output and the gradients of the leaves of :func:`_inputs` (``_forward_backward``'s results) are
    ``expected``'s in dtype, shape, strides and bits (None where it has none)."""
    names = ['out', 'projection', *(['scale', 'power'] if op == 'pola' else ['scale']), 'encoding', 'weight', 'bias']
    assert len(names) == len(got) == len(expected)
    for name, a, e in zip(names, got, expected):
        if e is None:
            assert a is None, name
            continue
        assert a.dtype == e.dtype and a.shape == e.shape and a.stride() == e.stride(), name
        assert torch.equal(a, e), f'{name}: differs by {(a.float() - e.float()).abs().max().item():.3g}'


def _gated_joined(op, leaves, hw, heads, with_bias=True, with_conv_bias=True, slots=(0, 1, 2, 3)):
    """The joined Function on views of one projection that fill it: Pola's q, k, v and gate at ``slots`` of a
    projection of 4 C channels (the gate None where ``slots`` has three: then the projection has 3 C channels,
    as FLatten's)."""
    projection, *params, encoding, weight, bias = leaves
    C = params[0].shape[-1]
    operands = projection[..., :len(slots) * C].unflatten(-1, (len(slots), C)).unbind(-2)
    q, k, v, *gate = (operands[slot] for slot in slots)
    conv_bias, key_bias = bias if with_conv_bias else None, encoding if with_bias else None
    if op == 'pola':
        scale, power = params
        return pola_value_term_triton(q, k, v, v, power, scale, weight, conv_bias, hw, key_bias=key_bias,
                                      gate=gate[0] if gate else None)
    return flatten_value_term_triton(q, k, v, v, params[0], heads, weight, conv_bias, hw, key_bias=key_bias)


def _gated_apart(op, leaves, hw, heads, with_bias=True, with_conv_bias=True, slots=(0, 1, 2, 3)):
    """:func:`_gated_joined` as the modules compute it without the gate and the projection in the Function: the
    joined Function on views of the projection's slots that do not fill it (its other channels left out), its
    output times the gate by the library."""
    projection, *rest = leaves
    C = rest[0].shape[-1]
    wider = torch.cat([projection, projection[..., :C]], -1)  # a slot more: the views do not fill it
    views = wider.unflatten(-1, (-1, C)).unbind(-2)
    q, k, v = (views[slots[i]] for i in range(3))
    conv_bias, key_bias = rest[-1] if with_conv_bias else None, rest[-3] if with_bias else None
    if op == 'pola':
        scale, power = rest[:2]
        out = pola_value_term_triton(q, k, v, v, power, scale, rest[-2], conv_bias, hw, key_bias=key_bias)
    else:
        out = flatten_value_term_triton(q, k, v, v, rest[0], heads, rest[-2], conv_bias, hw, key_bias=key_bias)
    return out * views[slots[3]] if len(slots) == 4 else out


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=['float32', 'bfloat16'])
@pytest.mark.parametrize('case', [(2, 2, (5, 7), 16, True, True, (0, 2, 3, 1)), (1, 3, (4, 6), 8, False, False,
                                                                                 (3, 0, 1, 2)),
                                  (1, 1, (9, 5), 32, True, False, (0, 1, 2))],
                         ids=['B2-h2-5x7-d16-qgkv', 'h3-no-biases-kvgq', 'h1-d32-qkv'])
@pytest.mark.parametrize('op', OPS)
def test_one_projection_and_the_gate_in_the_joined_function_give_autograds_results_bit_for_bit(op, case, dtype):
    """Where q, k, v (and Pola's gate) are views that fill one projection, the joined Function takes the projection
    and writes its gradient in one tensor (the views' gradients, v's two uses added, where autograd stacks them);
    with ``gate``, it multiplies its output by the gate as the library does. The output and every gradient equal,
    in dtypes, strides and bits, those of the Function on views that do not fill their projection followed by the
    library's multiplication."""
    B, heads, hw, d, with_bias, with_conv_bias, slots = case
    if op == 'flatten':  # no gate: q, k, v in the order of their slots in Pola's projection
        slots = tuple(sorted(slots[:3]).index(slot) for slot in slots[:3])
    leaves, grad = _inputs(op, B, heads, hw, d, dtype)
    C = heads * d
    leaves[0] = leaves[0].detach()[..., :len(slots) * C].clone().requires_grad_()
    joined = _forward_backward(_gated_joined, op, leaves, grad, hw, heads, with_bias, with_conv_bias, slots)
    apart = _forward_backward(_gated_apart, op, leaves, grad, hw, heads, with_bias, with_conv_bias, slots)
    _assert_bit_for_bit(op, joined, apart)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=['float32', 'bfloat16'])
def test_with_the_convolution_frozen_the_gate_and_the_projection_give_autograds_results_bit_for_bit(dtype):
    """Without the convolution's weight and bias gradients (frozen), whose kernel otherwise multiplies the gate's
    gradients, the gated joined Function on one projection still gives autograd's results (the library's
    products in its backward)."""
    leaves, grad = _inputs('pola', 2, 2, (5, 7), 16, dtype)
    leaves[-2], leaves[-1] = leaves[-2].detach(), leaves[-1].detach()
    joined = _forward_backward(_gated_joined, 'pola', leaves, grad, (5, 7), 2)
    apart = _forward_backward(_gated_apart, 'pola', leaves, grad, (5, 7), 2)
    _assert_bit_for_bit('pola', joined, apart)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=['float32', 'bfloat16'])
def test_the_gate_on_views_that_do_not_fill_a_projection_gives_autograds_results_bit_for_bit(dtype):
    """With a gate on views that do not fill one projection (each operand its own gradient), the joined Function's
    output and gradients are those of the Function without the gate followed by the library's multiplication."""
    leaves, grad = _inputs('pola', 2, 2, (5, 7), 16, dtype)

    def gated_views(op, leaves, hw, heads):
        projection, scale, power, encoding, weight, bias = leaves
        C = scale.shape[-1]
        views = torch.cat([projection, projection[..., :C]], -1).unflatten(-1, (-1, C)).unbind(-2)
        return pola_value_term_triton(views[0], views[1], views[2], views[2], power, scale, weight, bias, hw,
                                      key_bias=encoding, gate=views[3])

    joined = _forward_backward(gated_views, 'pola', leaves, grad, (5, 7), 2)
    apart = _forward_backward(_gated_apart, 'pola', leaves, grad, (5, 7), 2)
    _assert_bit_for_bit('pola', joined, apart)


def test_the_gate_and_the_values_two_gradients_are_in_the_convolutions_kernels():
    """On one projection with a gate, the joined Function's forward and backward run no library multiplication or
    addition: the convolution's kernel writes the gated output, the weight-gradient kernel the gate's gradient and
    the gradient before the gate, and the input-gradient kernel adds v's gradient from the convolution to the
    core's in the projection's gradient. The views that do not fill a projection take the library's products and
    autograd's sum of v's gradients."""
    leaves, grad = _inputs('pola', 2, 2, (4, 6), 8, torch.bfloat16)
    elementwise = {'mul', 'add', 'add_'}
    for fn, apart in ((_gated_joined, False), (_gated_apart, True)):
        with Operators() as forward:
            out = fn('pola', leaves, (4, 6), 2)
        with Operators() as backward:
            out.backward(grad)
        assert bool(elementwise & set(forward.names)) == apart, (fn.__name__, forward.names)
        assert bool(elementwise & set(backward.names)) == apart, (fn.__name__, backward.names)


def test_the_joined_function_takes_the_projection_where_its_views_fill_it_and_writes_one_gradient():
    """_one_projection: the slots of views that fill one contiguous projection (v_term v's slot again), else None;
    the backward of a step whose projection it takes stacks nothing (autograd's gradient of views taken apart)."""
    from mmpola.ops.value_term_triton import _one_projection
    projection = torch.randn(2, 6, 4 * 8)
    q, k, v, g = projection.unflatten(-1, (4, 8)).unbind(-2)
    assert _one_projection(q, k, v, v, g)[1] == ((2, 6, 4, 8), (0, 1, 2, 2, 3))
    assert _one_projection(g, v, k, k.view_as(k), q)[1][1] == (3, 2, 1, 1, 0)
    assert _one_projection(q, k, v, v, None) is None  # the gate's slot left out
    assert _one_projection(q, k, v, g, None) is None  # v_term another slot than v's
    assert _one_projection(q, k, v, v, q) is None  # a slot twice
    assert _one_projection(q.clone(), k, v, v, g) is None  # not a view
    assert _one_projection(q, k, v, v, torch.randn(2, 6, 8)) is None
    wide = torch.randn(2, 6, 5 * 8).unflatten(-1, (5, 8)).unbind(-2)
    assert _one_projection(*wide[:3], wide[2], wide[3]) is None  # a slot not filled
    strided = torch.randn(2, 4 * 8, 6).transpose(1, 2).unflatten(-1, (4, 8)).unbind(-2)
    assert _one_projection(*strided[:3], strided[2], strided[3]) is None  # not contiguous
    q, k, v = torch.randn(2, 6, 3 * 8).unflatten(-1, (3, 8)).unbind(-2)
    assert _one_projection(q, k, v, v, None)[1][1] == (0, 1, 2, 2, None)  # no gate: three slots
    # a linear layer's output (B, N, P * C) is a view of its (B * N, P * C) product: that product is taken
    linear = torch.nn.Linear(8, 4 * 8)
    product = linear(torch.randn(2, 6, 8))
    q, k, v, g = product.unflatten(-1, (4, 8)).unbind(-2)
    joined, layout = _one_projection(q, k, v, v, g)
    assert joined is product._base and joined.shape == (12, 32) and layout == ((2, 6, 4, 8), (0, 1, 2, 2, 3))

    # views whose gradients autograd takes elsewhere: those another Function returns, of its input or of its own
    class Operands(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, own):
            return tuple((x.clone() if own else x).unflatten(-1, (4, 8)).unbind(-2))

        @staticmethod
        def backward(ctx, *grads):
            return torch.stack(grads, -2).flatten(-2), None

    x = torch.randn(2, 6, 4 * 8, requires_grad=True)
    for own in (False, True):
        q, k, v, g = Operands.apply(x, own)
        assert _one_projection(q, k, v, v, g) is None, own
        with torch.no_grad():  # where autograd records nothing, the views' own projection is taken
            assert _one_projection(*x.unflatten(-1, (4, 8)).unbind(-2)[:3], x[..., 16:24], x[..., 24:])[0] is x

    leaves, grad = _inputs('pola', 2, 2, (4, 6), 8, torch.float32)
    for fn, stacks in ((_gated_joined, False), (_gated_apart, True)):
        out = fn('pola', leaves, (4, 6), 2)
        with Operators() as recorded:
            out.backward(grad)
        assert ('stack' in recorded.names) == stacks, fn.__name__


def _check_the_tokens(call, k, v):
    """A joined Function's ``call`` (the keyword arguments q, k, v and hw default to valid operands of a 4 x 6 grid)
    turns down another grid, operands of two shapes and of two dtypes, each with a clear error."""
    with pytest.raises(ValueError, match='grid'):
        call(hw=(5, 6))
    with pytest.raises(ValueError, match='one shape'):
        call(k=k[:, :12])
    with pytest.raises(TypeError, match='one dtype'):
        call(v=v.double())


@pytest.mark.parametrize('op', OPS)
def test_joined_function_checks_its_operands(op):
    leaves, _ = _inputs(op, 1, 2, (4, 6), 8, torch.float32)
    projection, scale, *rest = leaves
    encoding, weight, bias = rest[-3:]
    q, k, v, v_term = _split(projection, 16)
    if op == 'pola':
        def call(q=q, k=k, v=v, scale=scale, hw=(4, 6), key_bias=None):
            return pola_value_term_triton(q, k, v, v_term, rest[0], scale, weight, bias, hw, key_bias=key_bias)
    else:
        def call(q=q, k=k, v=v, scale=scale, hw=(4, 6), key_bias=None):
            return flatten_value_term_triton(q, k, v, v_term, scale, 2, weight, bias, hw, key_bias=key_bias)
    _check_the_tokens(call, k, v)
    with pytest.raises(ValueError, match='scale'):
        call(scale=scale.view(1, 2, 1, 8))
    with pytest.raises(ValueError, match='key_bias'):
        call(key_bias=encoding.double())
    if op == 'flatten':
        with pytest.raises(ValueError, match='focusing_factor'):
            flatten_value_term_triton(q, k, v, v_term, scale, 2, weight, bias, (4, 6), focusing_factor=0)


@pytest.mark.parametrize('op', OPS)
def test_the_joined_function_applies_where_both_ops_resolve_to_their_kernels_on_these_operands(op):
    """value_term_joins: both implementations resolve to the Triton kernels ('triton', or 'auto' where they run)
    and the kernels take the operands as they are; otherwise the ops are called apart."""
    leaves, _ = _inputs(op, 1, 2, (4, 6), 8, torch.float32)
    projection, weight = leaves[0], leaves[-2]
    q, k, v, v_term = _split(projection.detach(), 16)

    def joins(attn_impl='triton', conv_impl='triton', operands=(q, k, v, v_term), conv_weight=weight, fp32=True):
        return value_term_joins(op, attn_impl, fp32, conv_impl, *operands, conv_weight, 2)

    assert joins() and joins(fp32=False)
    assert not joins(attn_impl='fast') and not joins(conv_impl='torch')
    if DEVICE == 'cpu':  # 'auto' picks the library convolution on the CPU
        assert not joins(conv_impl='auto')
    assert not joins(operands=(q, k, v.double(), v_term))  # operands of two dtypes
    assert not joins(conv_weight=weight.double())  # a weight the convolution would not read in the values' dtype
    assert not joins(operands=(q[:, :0], k[:, :0], v[:, :0], v_term[:, :0]))  # nothing to launch
    with torch.autocast(torch.device(DEVICE).type, torch.bfloat16):
        assert not joins()  # float32 values under bf16 autocast: the convolution would cast them
        half = tuple(t.bfloat16() for t in (q, k, v, v_term))
        assert joins(operands=half) and joins(operands=half, conv_weight=weight.bfloat16())  # read as they are
        assert not joins(operands=half, conv_weight=weight.half())  # the convolution would cast it


def _inline_inputs(B, heads, hw, d, dtype, seed=0, kernel=3):
    """InLine's operands: one projection (q, k, v, v_term as in :func:`_split`), the residual's kernels per image
    and channel (float32, as the module's small network makes them without autocast), the output's gradient."""
    g = torch.Generator().manual_seed(seed)
    N, C = hw[0] * hw[1], heads * d
    projection = torch.randn(B, N, 4 * C, generator=g).to(DEVICE, dtype)
    kernels = (torch.randn(B, C, kernel, kernel, generator=g) * 0.3).to(DEVICE)
    return [projection.requires_grad_(), kernels.requires_grad_()], torch.randn(B, N, C, generator=g).to(DEVICE, dtype)


def _layout(t):
    """t's strides where they matter: those of its dims of more than one element (one image's output: the stride of
    its batch dim is arbitrary, and the library's empty_like chooses it otherwise for a 4-D map than a 5-D one)."""
    return tuple(stride for size, stride in zip(t.shape, t.stride()) if size > 1)


def _inline_joined(leaves, hw, heads):
    projection, kernels = leaves
    q, k, v, v_term = _split(projection, kernels.shape[1])
    return inline_value_term_triton(q, k, v, v_term, heads, kernels, hw)


def _inline_apart(leaves, hw, heads):
    """What InLine attention runs without the joined Function: the core, then the convolution of the values' map by
    each image's kernels with the core's output as its residual."""
    projection, kernels = leaves
    B, C = projection.shape[0], kernels.shape[1]
    q, k, v, v_term = _split(projection, C)
    out = inline_attention_triton(q, k, v, heads)
    with _autocast(v.dtype):  # the float32 kernels read as they are
        total = depthwise_conv2d_triton(v_term.reshape(B, *hw, C).permute(0, 3, 1, 2), kernels, None,
                                        per_sample=True, residual=out.transpose(1, 2).unflatten(2, hw))
    return total.flatten(2).transpose(1, 2)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=['float32', 'bfloat16'])
@pytest.mark.parametrize('case', [(2, 2, (5, 7), 16, 3), (1, 3, (4, 6), 8, 3), (2, 1, (9, 5), 32, 5)],
                         ids=['B2-h2-5x7-d16', 'h3-d8', 'B2-h1-d32-k5'])
def test_inline_joined_function_gives_the_two_ops_results_bit_for_bit(case, dtype):
    """InLine's core and its local residual (kernels per image): the output and the gradients of the projection
    (v's two uses added) and of the kernels equal those of inline_attention_triton followed by
    depthwise_conv2d_triton(per_sample=True), in the same dtypes and strides."""
    B, heads, hw, d, kernel = case
    leaves, grad = _inline_inputs(B, heads, hw, d, dtype, kernel=kernel)
    joined = _forward_backward(lambda op, leaves: _inline_joined(leaves, hw, heads), 'inline', leaves, grad)
    apart = _forward_backward(lambda op, leaves: _inline_apart(leaves, hw, heads), 'inline', leaves, grad)
    for name, a, e in zip(['out', 'projection', 'kernels'], joined, apart):
        assert a is not None and e is not None, name
        assert a.dtype == e.dtype and a.shape == e.shape and _layout(a) == _layout(e), name
        assert torch.equal(a, e), f'{name}: differs by {(a.float() - e.float()).abs().max().item():.3g}'
    assert joined[0].dtype == dtype and joined[2].dtype == torch.float32


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=['float32', 'bfloat16'])
@pytest.mark.parametrize('case', [(2, 2, (5, 7), 16, 3, (0, 1, 2)), (1, 3, (4, 6), 8, 3, (2, 0, 1))],
                         ids=['B2-h2-5x7-d16-qkv', 'h3-d8-kvq'])
def test_inline_joined_function_on_one_projection_gives_autograds_results_bit_for_bit(case, dtype):
    """InLine's q, k, v views that fill their projection: the joined Function takes the projection and writes its
    gradient in one tensor; the output and the gradients equal those of views that do not fill it (autograd's
    stack), in dtypes, strides and bits."""
    B, heads, hw, d, kernel, slots = case
    (projection, kernels), grad = _inline_inputs(B, heads, hw, d, dtype, kernel=kernel)
    C = heads * d
    leaves = [projection.detach()[..., :3 * C].clone().requires_grad_(), kernels]

    def run(fill):
        projection, kernels = leaves
        source = projection if fill else torch.cat([projection, projection[..., :C]], -1)
        views = source.unflatten(-1, (-1, C)).unbind(-2)
        q, k, v = (views[slot] for slot in slots)
        return inline_value_term_triton(q, k, v, v, heads, kernels, hw)

    joined = _forward_backward(lambda op, leaves: run(True), 'inline', leaves, grad)
    apart = _forward_backward(lambda op, leaves: run(False), 'inline', leaves, grad)
    for name, a, e in zip(['out', 'projection', 'kernels'], joined, apart):
        assert a.dtype == e.dtype and a.shape == e.shape and a.stride() == e.stride(), name
        assert torch.equal(a, e), f'{name}: differs by {(a.float() - e.float()).abs().max().item():.3g}'


def test_inline_joined_function_checks_its_operands():
    (projection, kernels), _ = _inline_inputs(2, 2, (4, 6), 8, torch.float32)
    q, k, v, v_term = _split(projection, 16)

    def call(q=q, k=k, v=v, kernels=kernels, hw=(4, 6)):
        return inline_value_term_triton(q, k, v, v_term, 2, kernels, hw)

    _check_the_tokens(call, k, v)
    for wrong in (kernels[:1], kernels[:, :8], kernels[..., :2], kernels[..., :2, :2], kernels[0]):
        with pytest.raises(ValueError, match='kernels'):
            call(kernels=wrong)


def test_the_inline_joined_function_applies_where_both_ops_resolve_to_their_kernels():
    """value_term_joins for InLine: its core's and the convolution's implementations resolve to the Triton kernels,
    and the kernels per image are read in the values' dtype (the autocast dtype under autocast)."""
    (projection, kernels), _ = _inline_inputs(1, 2, (4, 6), 8, torch.float32)
    q, k, v, v_term = _split(projection.detach(), 16)

    def joins(attn_impl='triton', conv_impl='triton', operands=(q, k, v, v_term), conv_weight=kernels):
        return value_term_joins('inline', attn_impl, True, conv_impl, *operands, conv_weight, 2)

    assert joins()
    assert not joins(attn_impl='fast') and not joins(attn_impl='reference') and not joins(conv_impl='torch')
    assert not joins(conv_weight=kernels.double())
    with torch.autocast(torch.device(DEVICE).type, torch.bfloat16):
        assert joins(operands=tuple(t.bfloat16() for t in (q, k, v, v_term)))


def _strided(shape, order, seed):
    """A tensor of ``shape`` whose dims are laid out in memory in ``order`` (outermost first), a view of a wider
    buffer for a gap between two dims where the seed says so."""
    g = torch.Generator().manual_seed(seed)
    sizes = [shape[i] for i in order]
    widen = int(torch.randint(0, len(sizes), (1, ), generator=g))
    padded = list(sizes)
    padded[widen] += int(torch.randint(0, 2, (1, ), generator=g))
    buffer = torch.randn(padded, generator=g)
    t = buffer[tuple(slice(0, n) for n in sizes)]
    return t.permute([order.index(i) for i in range(len(shape))])


@pytest.mark.parametrize('seed', range(40))
def test_the_joined_functions_views_have_the_library_views_sizes_and_strides(seed):
    """tokens_view of heads and the maps' tokens (one view operator where they can) give the sizes and strides of
    the library's transposes and flattens they replace, for any layout and with dims of one element (whose strides
    the library's view chooses): the Function's output and its parameters' gradients keep them."""
    from mmpola.ops.value_term_triton import _maps_as_tokens
    g = torch.Generator().manual_seed(1000 + seed)
    for _ in range(20):
        B, G, d, H, W = (int(n) for n in torch.randint(1, 4, (5, ), generator=g))
        heads_order = [int(i) for i in torch.randperm(4, generator=g)]
        heads = _strided((B, G, H * W, d), heads_order, seed)
        expected = heads.transpose(1, 2).flatten(2)
        got = tokens_view(heads)
        assert got.shape == expected.shape and got.stride() == expected.stride(), (heads.shape, heads.stride())
        assert torch.equal(got, expected)
        maps = _strided((B, G, d, H, W), [int(i) for i in torch.randperm(5, generator=g)], seed)
        expected = maps.permute(0, 1, 3, 4, 2).flatten(2, 3).transpose(1, 2).flatten(2)
        got = _maps_as_tokens(maps)
        assert got.shape == expected.shape and got.stride() == expected.stride(), (maps.shape, maps.stride())
        assert torch.equal(got, expected)


@pytest.mark.parametrize('op', OPS)
def test_where_autograd_records_nothing_the_functions_run_their_forward_alone(op, monkeypatch):
    """Under no_grad (inference, evaluation) and for inputs none of which needs a gradient (a frozen module), the
    kernels' autograd Functions run their forward without ``Function.apply`` (what it adds to the host's time of
    every call serves a backward that will not run): the same outputs, bit for bit, as where autograd records
    them, with the same sizes and strides."""
    from mmpola.ops import depthwise_triton, flatten_triton, pola_triton, value_term_triton

    hw, heads = (4, 6), 2
    leaves, _ = _inputs(op, 2, heads, hw, 8, torch.float32)
    recorded = {name: fn(op, leaves, hw, heads) for name, fn in (('joined', _joined), ('apart', _apart))}
    for function in (value_term_triton._ValueTermTriton, pola_triton._PolaTriton, flatten_triton._FlattenTriton,
                     depthwise_triton._DepthwiseTriton):
        def refuse(*args, function=function):
            raise AssertionError(f'{function.__name__}.apply called where autograd records nothing')
        monkeypatch.setattr(function, 'apply', refuse)
    frozen = [t.detach() for t in leaves]
    for context, operands in ((torch.no_grad(), leaves), (torch.enable_grad(), frozen)):
        for name, fn in (('joined', _joined), ('apart', _apart)):
            with context:
                out = fn(op, operands, hw, heads)
            expected = recorded[name]
            assert not out.requires_grad and out.shape == expected.shape and out.stride() == expected.stride()
            assert torch.equal(out, expected.detach()), name
    # where autograd records the call, apply runs (and refuses here)
    with pytest.raises(AssertionError, match='apply called'):
        _joined(op, leaves, hw, heads)


@pytest.mark.parametrize('amp', [None, torch.bfloat16], ids=['float32', 'bf16-autocast'])
def test_pacs_joined_function_gives_the_modules_results_bit_for_bit(amp, monkeypatch):
    """PaCS attention with its core and LePE in their Triton kernels runs them through the joined Function
    (pacs_value_term_triton: the projection's gradient in one tensor, the gate multiplied in the LePE's kernel); a
    forward hook on the LePE keeps the module's calls apart (the core's Function, the convolution's, the library's
    product with the gate and autograd's stack of the projection's gradient). Output and every parameter's gradient
    are the same bit for bit."""
    import mmpola.models.attention.pacs as pacs_module
    from mmpola.models.attention.pacs import PaCSAttention, RotaryEmbedding
    monkeypatch.setenv('MMPOLA_DEPTHWISE_CONV', 'triton')
    monkeypatch.setenv('MMPOLA_RECOMPUTE', 'torch')
    torch.manual_seed(0)
    C, heads, hw = 32, 2, (5, 7)
    module = PaCSAttention(C, heads, attn_impl='triton').to(DEVICE)
    with torch.no_grad():
        for p in (module.s1, module.s2):
            p.normal_(0, 0.5)
    table = RotaryEmbedding(2 * C, heads).to(DEVICE)(hw)
    x = torch.randn(2, hw[0] * hw[1], C, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    grad = torch.randn(2, hw[0] * hw[1], C, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    joined_calls = []
    joined = pacs_module.pacs_value_term_triton
    monkeypatch.setattr(pacs_module, 'pacs_value_term_triton',
                        lambda *args, **kwargs: joined_calls.append(1) or joined(*args, **kwargs))

    def run():
        module.zero_grad(set_to_none=True)
        with torch.autocast(torch.device(DEVICE).type, amp or torch.float32, enabled=amp is not None):
            out = module(x, hw, rope_feature=table)
        out.backward(grad.to(out.dtype))
        return [out.detach()] + [p.grad.clone() for p in module.parameters()]

    results = run()
    assert joined_calls == [1]
    handle = module.lepe.register_forward_hook(lambda *args: None)  # the module's calls apart
    apart = run()
    handle.remove()
    assert joined_calls == [1]
    names = ['out'] + [name for name, _ in module.named_parameters()]
    for name, a, e in zip(names, results, apart):
        assert a.dtype == e.dtype and a.shape == e.shape and a.stride() == e.stride(), name
        assert torch.equal(a, e), f'{name}: differs by {(a.float() - e.float()).abs().max().item():.3g}'


def test_pacs_joined_function_checks_its_operands():
    """pacs_value_term_triton turns down logits or rotary tables of other shapes, another grid and operands of two
    dtypes, each with a clear error."""
    from mmpola.ops.pacs import rope_angles, rope_tables
    C, heads, hw = 16, 2, (4, 6)
    q, k, v, g = torch.randn(1, 24, 4 * C).unflatten(-1, (4, C)).unbind(-2)
    s = torch.zeros(1, heads, 1, C)
    sin, cos = rope_tables(rope_angles(2 * C, heads), hw)
    weight = torch.zeros(C, 1, 5, 5)

    def call(**changed):
        args = dict(q=q, k=k, v=v, v_term=v, s_same=s, s_opp=s, sin=sin, cos=cos, num_heads=heads, lepe_weight=weight,
                    lepe_bias=None, hw=hw, gate=g)
        args.update(changed)
        return pacs_value_term_triton(**args)

    with pytest.raises(ValueError, match='s_opp'):
        call(s_opp=torch.zeros(1, heads, 1, C // 2))
    with pytest.raises(ValueError, match='rotary tables'):
        call(sin=sin[:, :4])
    _check_the_tokens(call, k, v)
