"""Attention kinds: the one table of attention modules a backbone stage can use.

A kind is a name (``'pola'``, ``'softmax'`` ...), the letter the official per-stage ``attn_type``
strings use for it (``'L'``, ``'S'`` ...) and a builder. Every built module has one interface::

    attn(x, hw) -> (B, N, C)      x: (B, N, C) tokens of an H x W map, hw = (H, W)

except a *windowed* kind (softmax in Swin blocks), which the block calls once per window as
``attn(windows, mask)``. Builders take the common arguments below plus the kind's own options
(``ATTENTION_KINDS[name].options``: names and defaults), which the backbones expose as keyword
arguments (``alpha=``, ``focusing_factor=`` ...)::

    build(layout, dim, num_heads, *, pe_grid, window_size, sr_ratio, qkv_bias, qk_scale,
          attn_drop, proj_drop, attn_impl, fp32_attn, **options)

``layout`` is ``'pvt'`` (keys/values may be spatially reduced by ``sr_ratio``) or ``'swin'``
(``pe_grid``: the positional-encoding grid; ``window_size``: the window of windowed kinds).

A new kind registers itself with :func:`register_attention_kind`; :func:`identify_attention_kind`
tells the kind of an attention module from the parameter names it holds (used by the checkpoint
loader to refuse weights of another kind).
"""
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, Dict, Optional

from .utils import PolaConfigError

__all__ = ['AttentionKind', 'ATTENTION_KINDS', 'register_attention_kind', 'get_attention_kind',
           'build_attention', 'identify_attention_kind', 'attention_signature']

# leaves every kind may or may not have (spatial reduction, recomputed buffers): not part of a signature
_OPTIONAL_LEAVES = ('sr.', 'norm.', 'relative_position_index', 'attn_mask')


@dataclass(frozen=True)
class AttentionKind:
    """One row of the table.

    Attributes:
        name: registry key (``'pola'``).
        letter: the official per-stage character (``'L'``).
        title: human name used in messages and class names (``'Pola'`` -> ``PolaPVT``).
        build: the builder (see the module docstring).
        options: the kind's own keyword arguments and their defaults.
        windowed: the Swin block partitions the map into (shifted) windows for it.
        layouts: the layouts it supports.
    """
    name: str
    letter: str
    title: str
    build: Callable
    options: Dict[str, object] = field(default_factory=dict)
    windowed: bool = False
    layouts: tuple = ('pvt', 'swin')


ATTENTION_KINDS: Dict[str, AttentionKind] = {}


def register_attention_kind(kind):
    """Add ``kind`` (an :class:`AttentionKind`) to the table; a name is registered once."""
    if kind.name in ATTENTION_KINDS:
        raise KeyError(f'attention kind {kind.name!r} is already registered')
    ATTENTION_KINDS[kind.name] = kind
    attention_signature.cache_clear()
    return kind


def get_attention_kind(name):
    if name not in ATTENTION_KINDS:
        raise PolaConfigError(f'unknown attention kind {name!r}; registered: {", ".join(ATTENTION_KINDS)}')
    return ATTENTION_KINDS[name]


def build_attention(name, layout, dim, num_heads, *, pe_grid=None, window_size=None, sr_ratio=1,
                    qkv_bias=True, qk_scale=None, attn_drop=0., proj_drop=0., attn_impl='auto',
                    fp32_attn=True, **options):
    """Build an attention module of kind ``name`` (see the module docstring)."""
    kind = get_attention_kind(name)
    if layout not in kind.layouts:
        raise PolaConfigError(f'{kind.title} attention has no {layout!r} layout (has: {", ".join(kind.layouts)})')
    unknown = sorted(set(options) - set(kind.options))
    if unknown:
        raise PolaConfigError(f'{kind.title} attention takes no argument {", ".join(unknown)}; its options: '
                              f'{", ".join(kind.options) or "none"}')
    opts = dict(kind.options, **options)
    return kind.build(layout, dim, num_heads, pe_grid=pe_grid, window_size=window_size, sr_ratio=sr_ratio,
                      qkv_bias=qkv_bias, qk_scale=qk_scale, attn_drop=attn_drop, proj_drop=proj_drop,
                      attn_impl=attn_impl, fp32_attn=fp32_attn, **opts)


def _signature_of(leaves):
    # biases are left out too: qkv_bias=False changes them, not the kind
    return frozenset(leaf for leaf in leaves
                     if not leaf.startswith(_OPTIONAL_LEAVES) and not leaf.endswith('.bias'))


@lru_cache(maxsize=None)
def attention_signature(name, layout):
    """The parameter names (below ``attn.``) of a kind's module, without optional parts."""
    import torch
    with torch.device('meta'):
        module = build_attention(name, layout, 8, 2, pe_grid=(2, 2), window_size=2)
    return _signature_of(module.state_dict())


def identify_attention_kind(leaves, layout=None):
    """The kind whose module holds exactly these parameter names (below ``attn.``), or None.

    Args:
        leaves: names such as ``['q.weight', 'kv.weight', 'dwc.weight', 'scale', ...]``.
        layout: ``'pvt'`` / ``'swin'`` or None (any).

    Returns:
        ``(kind name, layout)`` or None.
    """
    wanted = _signature_of(leaves)
    for name, kind in ATTENTION_KINDS.items():
        for lay in kind.layouts:
            if layout in (None, lay) and attention_signature(name, lay) == wanted:
                return name, lay
    return None


def attention_modules_of(state_dict_keys):
    """``{prefix ending in 'attn.': [leaf names]}`` of every attention module in a state dict."""
    out: Dict[str, list] = {}
    for key in state_dict_keys:
        head, sep, leaf = key.rpartition('.attn.')
        if sep and '.attn.' not in leaf:
            out.setdefault(head + sep, []).append(leaf)
    return out


def kinds_in_state_dict(state_dict_keys) -> Dict[str, Optional[tuple]]:
    """``{attention prefix: (kind, layout) or None}`` for every attention module of a state dict."""
    return {prefix: identify_attention_kind(leaves)
            for prefix, leaves in attention_modules_of(state_dict_keys).items()}


# --------------------------------------------------------------------------------------------------
# the built-in kinds


def _build_pola(layout, dim, num_heads, *, pe_grid, window_size, sr_ratio, qkv_bias, qk_scale, attn_drop,
                proj_drop, attn_impl, fp32_attn, alpha, kernel_size, v_upsample):
    from .layers import PolaAttention
    return PolaAttention(dim, num_heads, pe_grid, qkv_layout='qg_kv' if layout == 'pvt' else 'qkvg',
                         qkv_bias=qkv_bias, sr_ratio=sr_ratio, alpha=alpha, kernel_size=kernel_size,
                         proj_drop=proj_drop, v_upsample=v_upsample, attn_impl=attn_impl, fp32_attn=fp32_attn)


def _build_softmax(layout, dim, num_heads, *, pe_grid, window_size, sr_ratio, qkv_bias, qk_scale, attn_drop,
                   proj_drop, attn_impl, fp32_attn):
    from .layers import PVTAttention, WindowAttention
    if layout == 'pvt':
        return PVTAttention(dim, num_heads, qkv_bias=qkv_bias, qk_scale=qk_scale, attn_drop=attn_drop,
                            proj_drop=proj_drop, sr_ratio=sr_ratio)
    return WindowAttention(dim, window_size, num_heads, qkv_bias=qkv_bias, qk_scale=qk_scale,
                           attn_drop=attn_drop, proj_drop=proj_drop)


register_attention_kind(AttentionKind(
    'softmax', 'S', 'softmax', _build_softmax, windowed=True))
register_attention_kind(AttentionKind(
    'pola', 'L', 'Pola', _build_pola, options=dict(alpha=4.0, kernel_size=5, v_upsample='linear1d')))


def _build_flatten(layout, dim, num_heads, *, pe_grid, window_size, sr_ratio, qkv_bias, qk_scale, attn_drop,
                   proj_drop, attn_impl, fp32_attn, focusing_factor, kernel_size, v_upsample):
    from .layers import FocusedLinearAttention
    return FocusedLinearAttention(dim, num_heads, pe_grid, qkv_layout='q_kv' if layout == 'pvt' else 'qkv',
                                  qkv_bias=qkv_bias, sr_ratio=sr_ratio, focusing_factor=focusing_factor,
                                  kernel_size=kernel_size, proj_drop=proj_drop, v_upsample=v_upsample,
                                  attn_impl=attn_impl, fp32_attn=fp32_attn)


def _build_inline(layout, dim, num_heads, *, pe_grid, window_size, sr_ratio, qkv_bias, qk_scale, attn_drop,
                  proj_drop, attn_impl, fp32_attn):
    from .layers import InLineAttention
    return InLineAttention(dim, num_heads, qkv_layout='q_kv' if layout == 'pvt' else 'qkv', qkv_bias=qkv_bias,
                           sr_ratio=sr_ratio, proj_drop=proj_drop, attn_impl=attn_impl, fp32_attn=fp32_attn)


register_attention_kind(AttentionKind(
    'flatten', 'L', 'FLatten', _build_flatten,
    options=dict(focusing_factor=3, kernel_size=5, v_upsample='linear1d')))
register_attention_kind(AttentionKind('inline', 'I', 'InLine', _build_inline))
