"""The softmax kinds attend through torch's scaled_dot_product_attention (with qk_scale as its scale,
attention dropout as its dropout_p, Swin's bias and shift mask as one additive attn_mask) and compute
the explicit formula softmax(q k^T * scale + bias + mask) v, written out here in float64; CSWin's
stripes pad the map symmetrically as the official dense code."""
import warnings

import pytest
import torch
import torch.nn.functional as F

from mmpola.models import SpatialReductionAttention, StripeAttention, WindowAttention
from mmpola.models.attention import softmax as softmax_module
from mmpola.models.attention.softmax import shifted_window_mask, window_partition, window_reverse
from tests.fixtures.ops import DispatchedOps

TOL = {torch.float64: 1e-6, torch.float32: 1e-5}


@pytest.fixture
def sdpa_calls(monkeypatch):
    """The keyword arguments and mask of every F.scaled_dot_product_attention call."""
    calls = []
    original = F.scaled_dot_product_attention

    def counting(q, k, v, attn_mask=None, **kwargs):
        calls.append(dict(kwargs, attn_mask=attn_mask, q=q, k=k, v=v))
        return original(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, 'scaled_dot_product_attention', counting)
    return calls


def _explicit(q, k, v, scale, bias=None):
    attn = (q @ k.transpose(-2, -1)) * scale
    if bias is not None:
        attn = attn + bias
    return attn.softmax(dim=-1) @ v


def _heads(t, heads):
    """(B, N, C) -> (B, heads, N, d)."""
    return t.reshape(*t.shape[:2], heads, -1).transpose(1, 2)


def _merge(t):
    return t.transpose(1, 2).flatten(2)


def _sra_reference(attn, x, hw):
    """PVT / ViT softmax attention, written out."""
    h = attn.num_heads
    if attn.qkv_layout == 'fused':
        q, k, v = (_heads(t, h) for t in attn.qkv(x).chunk(3, dim=-1))
    else:
        q = _heads(attn.q(x), h)
        src = x
        if attn.sr_ratio > 1:
            B, N, C = x.shape
            src = attn.norm(attn.sr(x.transpose(1, 2).reshape(B, C, *hw)).flatten(2).transpose(1, 2))
        k, v = (_heads(t, h) for t in attn.kv(src).chunk(2, dim=-1))
    return attn.proj(_merge(_explicit(q, k, v, attn.scale)))


def _window_reference(attn, x, hw):
    """Swin's padded, shifted windows with bias and mask, written out (the official op order)."""
    B, _, C = x.shape
    H, W = hw
    ws, shift, h = attn.window_size, attn.shift_size, attn.num_heads
    x = F.pad(x.view(B, H, W, C), (0, 0, 0, (-W) % ws, 0, (-H) % ws))
    Hp, Wp = x.shape[1:3]
    x = torch.roll(x, (-shift, -shift), (1, 2)) if shift else x
    windows = window_partition(x, ws).view(-1, ws * ws, C)
    q, k, v = (_heads(t, h) for t in attn.qkv(windows).chunk(3, dim=-1))
    N = ws * ws
    bias = attn.relative_position_bias_table[attn.relative_position_index.view(-1)].view(N, N, -1).permute(2, 0, 1)
    scores = (q * attn.scale) @ k.transpose(-2, -1) + bias
    if shift:
        mask = shifted_window_mask((Hp, Wp), ws, shift, x.device).to(scores.dtype)
        scores = (scores.view(B, -1, h, N, N) + mask[None, :, None]).view(-1, h, N, N)
    out = attn.proj(_merge(scores.softmax(dim=-1) @ v))
    out = window_reverse(out.view(-1, ws, ws, C), ws, Hp, Wp)
    out = torch.roll(out, (shift, shift), (1, 2)) if shift else out
    return out[:, :H, :W].reshape(B, H * W, C)


def _stripe_reference(attn, x, hw):
    """CSWin stripes with LePE, one stripe at a time (symmetric zero padding, no mask)."""
    B, N, _, C = x.shape
    H, W = hw
    hsp, wsp = attn.stripe(hw)
    maps = x.permute(0, 2, 3, 1).reshape(B, 3, C, H, W)
    pad_h, pad_w = (-H) % hsp, (-W) % wsp
    maps = F.pad(maps, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
    out = torch.zeros_like(maps[:, 0])
    for r in range(0, H + pad_h, hsp):
        for c in range(0, W + pad_w, wsp):
            q, k, v = (maps[:, i, :, r:r + hsp, c:c + wsp] for i in range(3))
            q, k, tv = (_heads(t.flatten(2).transpose(1, 2), attn.num_heads) for t in (q, k, v))
            o = _merge(_explicit(q, k, tv, attn.scale)).transpose(1, 2).reshape(B, C, hsp, wsp)
            out[..., r:r + hsp, c:c + wsp] = o + attn.get_v(v)
    out = out[..., pad_h // 2:pad_h // 2 + H, pad_w // 2:pad_w // 2 + W]
    return out.flatten(2).transpose(1, 2)


def _cases():
    """(id, module factory, input shape, hw, context, reference)."""
    S, W, C = SpatialReductionAttention, WindowAttention, StripeAttention
    return [
        ('pvt-sr2', lambda: S(16, 2, sr_ratio=2), (2, 6 * 10, 16), (6, 10), {}, _sra_reference),
        ('pvt-global', lambda: S(16, 2, qk_scale=0.3), (2, 5 * 7, 16), (5, 7), {}, _sra_reference),
        ('vit-class-token', lambda: S(16, 4, qkv_layout='fused'), (2, 1 + 4 * 6, 16), (4, 6),
         dict(num_prefix_tokens=1), _sra_reference),
        ('swin', lambda: W(16, 2, window_size=4), (2, 8 * 12, 16), (8, 12), {}, _window_reference),
        ('swin-shift-pad', lambda: W(16, 2, window_size=4, shift=True), (2, 9 * 11, 16), (9, 11), {},
         _window_reference),
        ('swin-shift-batch1', lambda: W(16, 4, window_size=3, shift=True, qk_scale=0.2), (1, 7 * 6, 16),
         (7, 6), {}, _window_reference),
        ('cswin-vertical', lambda: C(8, 2, split_size=3, orientation='vertical'), (2, 7 * 8, 3, 8), (7, 8), {},
         _stripe_reference),
        ('cswin-whole', lambda: C(8, 2, orientation='whole', qk_scale=0.5), (2, 5 * 6, 3, 8), (5, 6), {},
         _stripe_reference),
    ]


CASES = _cases()


@pytest.mark.parametrize('dtype', [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize('case', range(len(CASES)), ids=[c[0] for c in CASES])
def test_softmax_kinds_call_sdpa_and_match_the_formula(sdpa_calls, case, dtype):
    _, factory, shape, hw, context, reference = CASES[case]
    torch.manual_seed(case)
    attn = factory().eval()
    with torch.no_grad():  # a visible bias: Swin's table is initialised at std 0.02
        for name, p in attn.named_parameters():
            if 'relative_position_bias_table' in name:
                p.normal_(std=1.0)
    x = torch.randn(shape, dtype=torch.float64)
    with torch.no_grad():
        expected = reference(attn.double(), x, hw)
        out = attn.to(dtype)(x.to(dtype), hw, **context)
    assert len(sdpa_calls) == 1
    call = sdpa_calls[0]
    assert call['scale'] == attn.scale and call['dropout_p'] == 0.0
    if isinstance(attn, WindowAttention):  # bias (and shift mask) as one float mask of q's dtype
        mask = call['attn_mask']
        tokens = attn.window_size ** 2
        assert mask is not None and mask.dtype == dtype and mask.shape[1:] == (attn.num_heads, tokens, tokens)
        assert mask.shape[0] in (1, call['q'].shape[0])
    else:
        assert call['attn_mask'] is None
    assert out.dtype == dtype and out.shape == expected.shape
    assert (out.double() - expected).abs().max() <= TOL[dtype]
    _assert_fused_kernels_take(call)


def _assert_fused_kernels_take(call):
    """The operands' head dim is their innermost (stride 1): scaled_dot_product_attention's fused kernels (flash,
    memory-efficient, cuDNN on CUDA; flash on the CPU) refuse others, and its math path, which holds every
    score, would run."""
    strides = {name: call[name].stride() for name in 'qkv'}
    assert all(stride[-1] == 1 for stride in strides.values()), strides


def test_attention_dropout_is_sdpa_dropout_in_training_only(sdpa_calls):
    x = torch.randn(2, 8 * 8, 16, requires_grad=True)
    vit = SpatialReductionAttention(16, 2, qkv_layout='fused', attn_drop=0.5).train()
    vit(x, (8, 8)).sum().backward()
    vit.eval()(x, (8, 8))
    attn = WindowAttention(16, 2, window_size=4, shift=True, attn_drop=0.25).train()
    with torch.no_grad():  # the bias needs no gradient: SDPA, with the module's dropout probability
        attn(x, (8, 8))
    assert [c['dropout_p'] for c in sdpa_calls] == [0.5, 0.0, 0.25]


def test_keys_and_values_split_once_in_the_backward():
    """The separate layout's k and v come from one ``kv`` projection: unbound, their gradients join in one
    stack; indexed, each would be a zero-filled tensor of the projection's size, then summed."""
    attn = SpatialReductionAttention(16, 2, sr_ratio=2)
    out = attn(torch.randn(2, 8 * 8, 16), (8, 8))
    with DispatchedOps() as ops:
        out.sum().backward()
    assert 'select_backward' not in ops.names and ops.names.count('stack') == 1


def test_a_learned_bias_trains_through_the_explicit_steps_on_the_cpu(sdpa_calls):
    """On the CPU, SDPA with a mask that needs its gradient runs its unfused math path; Swin's training
    forward there takes the explicit steps instead: the same values, the bias gets its gradient, and
    the attention dropout applies."""
    attn = WindowAttention(16, 2, window_size=4, shift=True).double()
    x = torch.randn(2, 8 * 8, 16, dtype=torch.float64)
    out = attn(x, (8, 8))
    out.sum().backward()
    assert not sdpa_calls
    with torch.no_grad():
        expected = attn(x, (8, 8))
    assert len(sdpa_calls) == 1
    assert (out.detach() - expected).abs().max() <= 1e-12
    assert attn.relative_position_bias_table.grad.abs().sum() > 0
    attn.attn_drop.p = 0.5
    attn.train()
    assert (attn(x, (8, 8)).detach() - expected).abs().max() > 1e-3  # dropout in training
    attn.eval()
    assert (attn(x, (8, 8)).detach() - expected).abs().max() <= 1e-12


def test_shift_masks_are_shared_across_calls_and_blocks():
    """One mask per (padded size, window, shift, device), built outside inference mode."""
    with torch.inference_mode():
        first = shifted_window_mask((12, 8), 4, 2, 'cpu')
    assert not first.is_inference() and not first.requires_grad
    assert shifted_window_mask((12, 8), 4, 2, torch.device('cpu')) is first
    assert shifted_window_mask((12, 12), 4, 2, 'cpu') is not first
    assert first.shape == (3 * 2, 16, 16) and set(first.unique().tolist()) == {-100.0, 0.0}
    blocks = [WindowAttention(16, 2, window_size=4, shift=True) for _ in range(2)]
    built = softmax_module._kept_shifted_window_mask.cache_info().misses
    for block in blocks:
        block(torch.randn(1, 12 * 8, 16), (12, 8))
    assert softmax_module._kept_shifted_window_mask.cache_info().misses == built


def test_shifted_windows_compile_as_one_graph():
    """Under torch.compile the mask is built in the graph (no Python cache call, no graph break)."""
    torch.manual_seed(0)
    attn = WindowAttention(16, 2, window_size=4, shift=True).eval()
    x = torch.randn(2, 9 * 11, 16)
    compiled = torch.compile(attn, backend='eager', fullgraph=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings('error', message='.*lru_cache')  # what dynamo says of a cached function
        assert torch.allclose(compiled(x, (9, 11)), attn(x, (9, 11)), atol=1e-6)


def _stripes_one_by_one(attn, qkv, hw):
    """CSWin's stripe softmax written as a loop over the stripes of the symmetrically zero-padded map
    (the official dense code's padding); LePE convolves each stripe on its own."""
    B, N, _, C = qkv.shape
    H, W = hw
    hsp, wsp = attn.stripe(hw)
    pad_h, pad_w = (-H) % hsp, (-W) % wsp
    maps = F.pad(qkv.permute(0, 2, 3, 1).reshape(B, 3, C, H, W),
                 (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
    heads, d = attn.num_heads, C // attn.num_heads
    out = torch.zeros(B, C, H + pad_h, W + pad_w)

    def tokens(t):
        return t.flatten(2).transpose(1, 2).reshape(B, -1, heads, d).transpose(1, 2)

    for r in range(0, H + pad_h, hsp):
        for c in range(0, W + pad_w, wsp):
            q, k, v = (maps[:, i, :, r:r + hsp, c:c + wsp] for i in range(3))
            weights = ((tokens(q) * attn.scale) @ tokens(k).transpose(-2, -1)).softmax(dim=-1)
            o = (weights @ tokens(v)).transpose(1, 2).reshape(B, -1, C).transpose(1, 2).reshape(B, C, hsp, wsp)
            out[..., r:r + hsp, c:c + wsp] = o + attn.get_v(v)
    out = out[..., pad_h // 2:pad_h // 2 + H, pad_w // 2:pad_w // 2 + W]
    return out.flatten(2).transpose(1, 2)


@pytest.mark.parametrize('batch', [1, 2])
@pytest.mark.parametrize('hw', [(14, 14), (6, 9), (13, 20)], ids=lambda s: f'{s[0]}x{s[1]}')
@pytest.mark.parametrize('orientation', StripeAttention.ORIENTATIONS)
def test_cswin_stripes_pad_symmetrically_as_the_official_dense_code(orientation, hw, batch, sdpa_calls):
    """The padded maps too hand scaled_dot_product_attention operands its fused kernels take (a CSWin stage
    whose map is no multiple of its stripes' width, most detection sizes at the third stage; one image: the
    horizontal stripes of a padded map were views of it, its channels the outermost axis)."""
    torch.manual_seed(0)
    attn = StripeAttention(8, 2, split_size=4, orientation=orientation).eval()
    qkv = torch.randn(batch, hw[0] * hw[1], 4, 8)[:, :, :3]  # a view of a projection, as the CSWin block's
    with torch.no_grad():
        assert torch.allclose(attn(qkv, hw), _stripes_one_by_one(attn, qkv, hw), atol=1e-5)
    assert len(sdpa_calls) == 1
    _assert_fused_kernels_take(sdpa_calls[0])

