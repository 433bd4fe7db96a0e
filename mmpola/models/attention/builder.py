"""How a backbone builds an attention module: the one contract of every kind.

A kind is an ``nn.Module`` registered in :data:`mmpola.registry.ATTENTIONS` under a short name::

    from mmpola.registry import ATTENTIONS

    @ATTENTIONS.register_module(name='pola')
    class PolaAttention(nn.Module):
        letter = 'L'        # its letter in the official per-stage strings (default 'L')
        title = 'Pola'      # its name in messages (default: the registered name)
        paper = 'PolaFormer'  # the release it comes from, in messages (default: its title)
        citation = 'PolaFormer, ICLR 2025'  # the release in docstrings (default: its paper)
        paper_title = 'PolaFormer: Polarity-aware ...'    # timm's paper_name of its entries
        paper_url = 'https://github.com/ZacharyMeng/PolaFormer'  # timm's origin_url of its entries
        op = 'pola'         # its op in mmpola.ops (OPS), whose implementations attn_impl chooses

        def __init__(self, dim, num_heads, pe_grid, qkv_layout='fused', sr_ratio=1, ..., alpha=4.0):
        def forward(self, x, hw, **context):   # x (B, N, C) tokens of an H x W map -> (B, N, C)

**Calling convention.** ``attn(x, hw, **context)`` with x (B, N, C), the row-major tokens of an
H x W map, and ``hw = (H, W)``; it returns (B, N, C). Windowing, padding, shifts and masks (Swin's
softmax), stripes (CSWin's softmax), spatial reduction (PVT) belong to the module that needs them.
``context`` holds what an architecture hands every block (PolaFormer++: its RoPE tables
``rope_head`` and ``rope_feature``; the ViT: ``num_prefix_tokens``, the class token in front of the
H x W grid tokens; CSWin: ``x_mean``); a kind ignores what it does not use, so it accepts
``**context``. Two architectures need more of a kind, which it declares as class attributes:

* CSWin's blocks own the projections (one ``qkv`` and one ``proj`` shared by the block's branches,
  the official key layout) and call each branch with its channels of the projected operands,
  x (B, N, P, c) (``qkv_layout='projected'``): a kind that runs there lists ``'projected'`` in
  ``qkv_layouts`` and says how many operands it needs in ``projections`` (default 3: q, k, v;
  Pola 4: q, k, v, g);
* the ViT's class token: a kind that takes ``num_prefix_tokens`` (the first P tokens are not on the
  grid) sets ``prefix_tokens = True``.

**What a module gets.** The backbone passes, by keyword, the arguments below that the module's
``__init__`` names (all of them to a module that takes ``**kwargs``):

* common, from every architecture: ``dim``, ``num_heads``, ``pe_grid`` (the (H, W) token grid the
  attention saw at the pretraining resolution: where learned positional encodings are stored),
  ``qkv_bias``, ``qk_scale``, ``attn_drop``, ``proj_drop``, ``attn_impl`` (the op implementation,
  mmpola.ops.dispatch), ``fp32_attn`` (the op's fp32 island under autocast);
* the architecture's context (``attention_context`` of each backbone): PVT and PVTv2
  ``qkv_layout='separate'`` and ``sr_ratio``; Swin ``qkv_layout='fused'``, ``window_size``, ``shift``,
  ``clamp_shift``; CSWin ``qkv_layout='projected'``, ``split_size``, ``orientation``; the ViT
  ``qkv_layout='fused'``; PolaFormer++ ``qkv_layout='fused'``.

**Options.** Every other argument of ``__init__`` is an option of the kind, set by the user next to
its type: ``attn=dict(type='pola', alpha=4.0)``. An option the kind does not take is a one-line
error naming the kind's options; an option that is one of the arguments above is refused as well
(the backbone sets those).
"""
import inspect

from mmpola.registry import ATTENTIONS

from ..checks import PolaConfigError

__all__ = ['COMMON_ARGS', 'attention_class', 'attention_title', 'attention_paper', 'attention_letter',
           'attention_citation', 'attention_publication', 'attention_op', 'attention_options',
           'attention_kind_of', 'split_attention_cfg', 'build_attention', 'registered_attention_kinds']

COMMON_ARGS = ('dim', 'num_heads', 'pe_grid', 'qkv_bias', 'qk_scale', 'attn_drop', 'proj_drop', 'attn_impl',
               'fp32_attn')


def registered_attention_kinds():
    """Names of every registered kind."""
    return tuple(ATTENTIONS.module_dict)


def attention_class(kind):
    """The registered class of ``kind``; an unknown name is a clear error listing the kinds."""
    cls = ATTENTIONS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise PolaConfigError(f'unknown attention kind {kind!r}; registered: {", ".join(registered_attention_kinds())} '
                              '(register your own with @mmpola.registry.ATTENTIONS.register_module())')
    return cls


def attention_title(kind):
    """The kind's name in messages (``'Pola'``; the registered name when the class has no ``title``)."""
    return getattr(attention_class(kind), 'title', None) or kind


def attention_paper(kind):
    """The release the kind comes from (``'PolaFormer'``; its title when the class has no ``paper``)."""
    return getattr(attention_class(kind), 'paper', None) or attention_title(kind)


def attention_citation(kind):
    """The release of the kind in docstrings (``'PolaFormer, ICLR 2025'``; its paper when the class has
    no ``citation``)."""
    return getattr(attention_class(kind), 'citation', None) or attention_paper(kind)


def attention_publication(kind):
    """``(paper title, origin url)`` of the kind's release (timm's ``paper_name`` / ``origin_url``);
    ``(its paper, '')`` when the class does not name them."""
    cls = attention_class(kind)
    return getattr(cls, 'paper_title', None) or attention_paper(kind), getattr(cls, 'paper_url', None) or ''


def attention_op(kind):
    """The op of :mod:`mmpola.ops` the kind runs (``'pola'``), or None (the softmaxes, a kind without ``op``)."""
    return getattr(attention_class(kind), 'op', None)


def attention_letter(kind):
    """The kind's letter in the official per-stage ``attn_type`` strings (``'L'`` unless it says)."""
    return getattr(attention_class(kind), 'letter', 'L')


def attention_kind_of(module):
    """The registered name of an attention module (or class), or None."""
    cls = module if isinstance(module, type) else type(module)
    for name, registered in ATTENTIONS.module_dict.items():
        if registered is cls:
            return name
    return None


def _init_parameters(cls):
    """(named keyword parameters of ``cls.__init__`` with their defaults, takes **kwargs)."""
    params = inspect.signature(cls.__init__).parameters
    named = {name: p.default for name, p in list(params.items())[1:]
             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return named, any(p.kind is p.VAR_KEYWORD for p in params.values())


def attention_options(kind, context=()):
    """``{option: default}`` of ``kind``: its ``__init__`` arguments other than the common ones and
    the names in ``context``."""
    named, _ = _init_parameters(attention_class(kind))
    return {name: default for name, default in named.items() if name not in COMMON_ARGS and name not in context}


def split_attention_cfg(attn, default_kind=None):
    """``'pola'`` or ``dict(type='pola', **options)`` -> ``('pola', options)``; without a type the
    ``default_kind``."""
    if attn is None:
        attn = {}
    if isinstance(attn, str):
        return attn, {}
    if not isinstance(attn, dict):
        raise PolaConfigError(f"attn must be an attention kind name or a dict(type='pola', **options), got {attn!r}")
    options = dict(attn)
    kind = options.pop('type', None) or default_kind
    if kind is None:
        raise PolaConfigError(f"attn needs a type, e.g. attn=dict(type='pola'); registered kinds: "
                              f'{", ".join(registered_attention_kinds())}')
    if not isinstance(kind, str):  # a class given directly, as mmengine configs allow
        name = attention_kind_of(kind)
        if name is None:
            raise PolaConfigError(f'attention class {kind.__name__} is not registered in mmpola.registry.ATTENTIONS')
        kind = name
    return kind, options


def build_attention(attn, dim, num_heads, **context):
    """Build the attention module of ``attn`` (``'pola'`` or ``dict(type='pola', **options)``).

    Args:
        attn: the kind and its options.
        dim, num_heads: channels and heads of the stage.
        **context: the common arguments and the architecture's context (see the module docstring);
            each is passed only if the module's ``__init__`` names it.

    Returns:
        the module; ``module(x, hw, **context)`` maps (B, N, C) tokens to (B, N, C).
    """
    kind, options = split_attention_cfg(attn)
    cls = attention_class(kind)
    named, any_kwargs = _init_parameters(cls)
    given = dict(dim=dim, num_heads=num_heads, **context)
    for name in options:
        if name in given:
            raise PolaConfigError(f'{attention_title(kind)} attention option {name}={options[name]!r} is set by the '
                                  f'backbone ({name}={given[name]!r}); set it on the backbone instead')
        if name not in named and not any_kwargs:
            valid = attention_options(kind, given)
            raise PolaConfigError(
                f"{attention_title(kind)} attention (type='{kind}') has no option {name!r}; its options: "
                f"{', '.join(f'{k}={v!r}' for k, v in valid.items()) or 'none'}")
    kwargs = {name: value for name, value in given.items() if name in named or any_kwargs}
    return cls(**kwargs, **options)
