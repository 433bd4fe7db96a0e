"""PolaFormer++'s attentions: polarity-aware linear attention with channel-wise spikiness (kind
``'pacs'``) and its last-stage softmax attention with 2-D RoPE (kind ``'rope_softmax'``, letter
``'S'`` of PolaFormer++).

Both take the RoPE tables of the stage map from the architecture as context
(:class:`~mmpola.models.backbones.polapp.PolaPPBackbone` hands every block both):

* ``rope_head``: (2, N, d) sin and cos for per-head features (d = C / h);
* ``rope_feature``: (2, N, 2d) for the PaCS feature maps, twice as wide as a head.
"""
import torch
import torch.nn as nn
from timm.layers import register_notrace_module

from mmpola.ops import (
    check_attn_impl,
    depthwise_conv_impl,
    pacs_attention,
    rope_angles,
    rope_rotate,
    rope_rotate_fast,
    rope_tables,
    scaled_dot_product_attention,
)
from mmpola.ops.value_term_triton import pacs_value_term_triton, value_term_joins
from mmpola.registry import ATTENTIONS

from ..layers import DepthwiseConv2d, SizeCache, gated_proj, gated_proj_recomputes, hooked, tokens_as_map

__all__ = ['PaCSAttention', 'RoPESoftmaxAttention', 'RotaryEmbedding']


@register_notrace_module  # torch.fx leaf: the tables depend on the run-time map size
class RotaryEmbedding(nn.Module):
    """The official 2-D RoPE angles (buffer ``angle``, kept in checkpoints) -> tables of a grid.

    ``dim`` is the width the rotation acts on summed over heads: C for softmax attention, 2C for the
    PaCS feature maps (which are twice as wide as a head).
    """

    def __init__(self, dim, num_heads, base=10000.0):
        super().__init__()
        self.register_buffer('angle', rope_angles(dim, num_heads, base))
        self._tables = SizeCache(maxsize=2)

    def forward(self, hw):
        """(H, W) -> (2, H * W, 2 * len(angle)): sin and cos stacked (one tensor, so a traced graph can
        index it). The tables of the last sizes are kept (they depend on the size and the buffer only)."""
        angle = self.angle
        return self._tables.get(tuple(hw), lambda: torch.stack(rope_tables(angle, hw)), angle)


def _rope_table(context, name, kind):
    table = context.get(name)
    if table is None:
        raise ValueError(f"{kind} attention needs the RoPE tables '{name}' of the map as context (the "
                         'PolaFormer++ architecture gives them); this architecture does not')
    return table


@ATTENTIONS.register_module(name='pacs')
@register_notrace_module  # torch.fx leaf: custom autograd Function, run-time shapes
class PaCSAttention(nn.Module):
    """Polarity-aware linear attention with channel-wise spikiness (the official linear block).

    ``qkvg`` projects to queries, keys, values and a gate; ``lepe`` is a 5x5 depthwise conv on the
    values (:class:`~mmpola.models.layers.DepthwiseConv2d`); ``s1`` / ``s2`` are the per-channel
    spikiness logits of the same-sign and opposite-sign flows; the core is
    :func:`mmpola.ops.pacs_attention` (``attn_impl``: its implementations).

    Shapes: ``forward(x, hw, rope_feature=...)``: x (B, N, C) tokens of the H x W map, tables
    (2, N, 2 * head_dim) -> (B, N, C).
    """

    letter = 'L'
    title = 'PaCS'
    paper = 'PolaFormer++'
    citation = 'PolaFormer++'
    paper_title = 'PolaFormer++: Polarity-aware Linear Attention with Channel-wise Spikiness'
    paper_url = 'https://github.com/ZacharyMeng/PolaFormerPP'
    op = 'pacs'

    def __init__(self, dim, num_heads, attn_impl='auto', fp32_attn=True):
        super().__init__()
        if dim % num_heads or (dim // num_heads) % 2:
            raise ValueError(f'PaCSAttention needs an even head dim: channels {dim} / heads {num_heads}')
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkvg = nn.Linear(dim, dim * 4)
        self.lepe = DepthwiseConv2d(dim, 5)
        self.proj = nn.Linear(dim, dim)
        self.s1 = nn.Parameter(torch.zeros(1, num_heads, 1, 2 * self.head_dim))
        self.s2 = nn.Parameter(torch.zeros(1, num_heads, 1, 2 * self.head_dim))
        self.attn_impl = check_attn_impl(attn_impl, op=self.op)
        self.fp32_attn = fp32_attn

    def forward(self, x, hw, **context):
        sin, cos = _rope_table(context, 'rope_feature', 'PaCS')
        C = x.shape[-1]
        # views of the projection, whose gradients autograd stacks into the projection's layout (no copy)
        q, k, v, g = self.qkvg(x).unflatten(-1, (4, C)).unbind(-2)
        if not hooked(self.lepe) and value_term_joins(self.op, self.attn_impl, self.fp32_attn, depthwise_conv_impl(),
                                                      q, k, v, v, self.lepe.weight, self.num_heads):
            # the core and the LePE in their Triton kernels, in one autograd Function that takes the projection
            # whose views q, k, v and g are (one gradient for it), and the gate, unless every layer's kernels run
            # ('triton'): then gated_linear's multiply it
            gate = None if gated_proj_recomputes(q, self.proj, joins=True) else g
            x = pacs_value_term_triton(q, k, v, v, self.s1, self.s2, sin, cos, self.num_heads, self.lepe.weight,
                                       self.lepe.bias, hw, gate=gate)
            return gated_proj(x, g, self.proj) if gate is None else self.proj(x)
        heads = (self.num_heads, self.head_dim)
        x = pacs_attention(*(t.unflatten(-1, heads).transpose(1, 2) for t in (q, k, v)), self.s1, self.s2, sin, cos,
                           fp32=self.fp32_attn, impl=self.attn_impl)
        # x + lepe(v), added where the convolution's kernel writes it (where it runs), in x's (tokens') layout
        x = self.lepe(tokens_as_map(v, hw), residual=tokens_as_map(x.transpose(1, 2), hw))
        return gated_proj(x.flatten(2).transpose(1, 2), g, self.proj)

    def extra_repr(self):
        return f'dim={self.dim}, num_heads={self.num_heads}, attn_impl={self.attn_impl!r}'


@ATTENTIONS.register_module(name='rope_softmax')
@register_notrace_module  # torch.fx leaf: run-time shapes
class RoPESoftmaxAttention(nn.Module):
    """Softmax attention with RoPE on queries and keys (the official last-stage block).

    ``qkvo`` projects to queries, keys, values and an output gate; ``lepe`` as in
    :class:`PaCSAttention`. ``attn_impl='reference'`` runs the official op order, any other
    torch's ``scaled_dot_product_attention`` (same function, fused kernels; :mod:`mmpola.ops.sdpa`).

    Shapes: ``forward(x, hw, rope_head=...)``: x (B, N, C), tables (2, N, head_dim) -> (B, N, C).
    """

    letter = 'S'
    title = 'RoPE softmax'

    def __init__(self, dim, num_heads, attn_impl='auto'):
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkvo = nn.Linear(dim, dim * 4)
        self.lepe = DepthwiseConv2d(dim, 5)
        self.proj = nn.Linear(dim, dim)
        self.attn_impl = check_attn_impl(attn_impl)

    def forward(self, x, hw, **context):
        sin, cos = _rope_table(context, 'rope_head', 'RoPE softmax')
        C = x.shape[-1]
        q, k, v_tokens, o = self.qkvo(x).unflatten(-1, (4, C)).unbind(-2)  # views, as in PaCSAttention
        q, k, v = (t.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2) for t in (q, k, v_tokens))
        sin, cos = sin.to(q.dtype), cos.to(q.dtype)
        if self.attn_impl == 'reference':
            q, k = rope_rotate(q, sin, cos), rope_rotate(k, sin, cos)
            x = torch.softmax(self.scale * q @ k.transpose(-1, -2), dim=-1) @ v
        else:
            q, k = rope_rotate_fast(q, sin, cos), rope_rotate_fast(k, sin, cos)
            x = scaled_dot_product_attention(q, k, v.contiguous(), scale=self.scale)
        x = self.lepe(tokens_as_map(v_tokens, hw), residual=tokens_as_map(x.transpose(1, 2), hw))
        return self.proj(x.flatten(2).transpose(1, 2) * o)  # (x + lepe(v)) * o

    def extra_repr(self):
        return f'dim={self.dim}, num_heads={self.num_heads}, attn_impl={self.attn_impl!r}'
