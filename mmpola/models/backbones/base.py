"""The shared contract of mmpola's dense backbones: one class per macro architecture.

:class:`DenseBackbone` holds what every architecture has in common, so an architecture file
(pvt.py, swin.py, polapp.py) keeps only what is its own: its modules and official key layout, how a
stage is entered, which parts a frozen stage covers and its checkpoint filter (its official
classification head lives beside it, in the same file: :mod:`mmpola.models.classification_head`).

* arguments: ``arch`` presets / custom dicts, ``out_indices``, ``frozen_stages``, ``out_norm``,
  ``norm_eval`` (a no-op unless the architecture has
  BatchNorms), ``with_cp``, with clear errors;
* the attention: ``attn`` (the kind and its options, ``dict(type='pola', alpha=4.0)``) and
  ``attn_type`` (the per-stage layout in the official letters, see :func:`parse_attn_type`),
  ``attn_impl`` and ``fp32_attn`` for every attention (:meth:`build_attention`);
* the stage loop with input checks and gradient checkpointing of every block
  (:meth:`forward_stages`), the NCHW outputs with optional output norms (:meth:`forward`),
  ``out_channels``;
* ``init_weights`` with ``init_cfg=dict(type='Pretrained', checkpoint=...)`` through
  :func:`mmpola.checkpoint.load_checkpoint` (which refuses checkpoints of another architecture or
  attention kind), ``set_attn_impl``, freezing kept through ``train()``;
* the stochastic-depth schedule (:func:`drop_path_rates`).

An architecture::

    @register_architecture('myarch', title='MyArch')   # MODELS 'MyArchBackbone', ARCHITECTURES 'myarch'
    class MyArchBackbone(DenseBackbone):
        arch_settings = {'tiny': dict(...)}   # presets; arch_keys: the keys of a custom dict
        arch_keys = ('embed_dims', 'depths', 'num_heads')
        softmax_attn = 'softmax'              # the kind of the letter 'S'
        attention_context = ('qkv_layout',)   # what it gives every attention module besides the common args

        def __init__(self, arch='tiny', ..., **common):
            super().__init__(arch=arch, **common)     # checks and stores the common arguments
            ...                                       # self.arch: the resolved arch dict
            self.init_stages()                        # self.depths ... (arch_keys), the kind of every block
            attn = self.build_attention(i, j, dim, num_heads, pe_grid=..., qkv_layout='fused', ...)
            self._finish_init()                       # output norms, official init, freezing

        def _stem(self, x):              # image -> (x, hw) given to stage 0
        def _enter_stage(self, i, x, hw):   # output of stage i - 1 (or the stem) -> input of stage i
        def _stage_blocks(self, i):      # the blocks of stage i: each is called block(x, hw, **context)
        def _exit_stage(self, i, x, hw): # after the blocks of stage i (PVTv2: its trained stage norm)
        def _stem_parts(self):           # (modules, parameters) frozen by frozen_stages >= 0 (timm: the stem group)
        def _stage_parts(self, i):       # (modules, parameters) of stage i, frozen when i < frozen_stages
        def stage_module(self, i):       # name of stage i's blocks (timm's feature_info)

    and, where the defaults (four stages of tokens, LayerNorm output norms ``norm{i}``) do not fit:
    ``stages_of`` / ``default_out_indices`` (a stage per block: the ViT), ``_block_context`` (keyword
    context of every block), ``_stage_output`` / ``stage_map`` / ``output_norm`` / ``output_norm_name``
    / ``_add_output_norms`` (stages of NCHW maps, prefix tokens, other norm names), ``_handoff_dtype`` (the
    dtype in which the next stage reads a stage's output: PVT's convolution under autocast),
    ``checkpoint_filter`` (the official key layout).

Input: (B, in_channels, H, W) with H, W >= ``min_input_size``. Output: a tuple of NCHW maps for
``out_indices``.
"""

import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from mmengine.model import BaseModule

from mmpola.checkpoint import KeySignature, load_checkpoint
from mmpola.ops import check_attn_impl, check_recompute_impl, current_recompute_scope, recompute_scope
from mmpola.ops.dispatch import recording
from mmpola.registry import ARCHITECTURES, MODELS

from ..attention import (
    attention_class,
    attention_kind_of,
    attention_letter,
    attention_options,
    attention_paper,
    attention_title,
    build_attention,
    registered_attention_kinds,
    split_attention_cfg,
)
from ..checks import (
    PolaConfigError,
    check_frozen_stages,
    check_input,
    check_out_indices,
    check_pretrained_cfg,
    is_pretrained_cfg,
    resolve_arch,
)
from ..classification_head import classification_head_of
from ..layers import add_and_cast, hooked, trunc_normal_init

__all__ = ['DenseBackbone', 'register_architecture', 'parse_attn_type', 'drop_path_rates', 'tokens_to_nchw',
           'run_blocks']


def register_architecture(name, title=None):
    """Class decorator of a macro architecture: registers it in mmengine's root ``MODELS`` under its
    class name (mmdet / mmseg configs build it by ``type=``) and in
    :data:`mmpola.registry.ARCHITECTURES` under ``name`` (the classifier's ``family=``, the
    checkpoint signatures, the benchmark)."""
    def register(cls):
        cls.family = name
        cls.title = title or name
        ARCHITECTURES.register_module(name=name, module=cls)
        MODELS.register_module(module=cls)
        return cls

    return register


def drop_path_rates(drop_path_rate, depths):
    """Stochastic depth rising linearly over all blocks (the official rule), split per stage."""
    total = sum(depths)
    rates = torch.linspace(0, drop_path_rate, total, device='cpu').tolist() if total > 1 else [0.0] * total
    out, cur = [], 0
    for depth in depths:
        out.append(rates[cur:cur + depth])
        cur += depth
    return out


class _TokensToMap(torch.autograd.Function):
    """The copy of tokens to a contiguous map whose backward returns the gradient as contiguous tokens."""

    @staticmethod
    def forward(ctx, tokens, height, width):
        return tokens.reshape(tokens.shape[0], height, width, -1).permute(0, 3, 1, 2).contiguous()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        B, C = grad.shape[:2]
        return grad.permute(0, 2, 3, 1).contiguous().view(B, -1, C), None, None


def tokens_to_nchw(tokens, hw, grad_as_tokens=False):
    """(B, H*W, C) row-major tokens and (H, W) -> contiguous (B, C, H, W).

    The map's gradient (a neck's convolution gives contiguous NCHW) seen in place as tokens is channel-strided.
    ``grad_as_tokens``: copy it once to contiguous tokens instead, for tokens that several ops made and will
    each copy such a gradient for themselves (the last block's linear layers and norm, a stage output without
    an output norm); a norm alone reads it as it is. Tokens that are the map's view (written in its layout) give the
    map itself, and its gradient comes back to them in place."""
    if (not grad_as_tokens or recording() or not (torch.is_grad_enabled() and tokens.requires_grad)
            or tokens.stride(-1) != 1):
        return tokens.reshape(tokens.shape[0], hw[0], hw[1], -1).permute(0, 3, 1, 2).contiguous()
    return _TokensToMap.apply(tokens, hw[0], hw[1])


def run_blocks(blocks, x, hw, with_cp=False, cast=None, as_map=False, **context):
    """``x = block(x, hw, **context)`` for every block, each checkpointed when ``with_cp`` and training.

    A block that ``defers_residual`` (:class:`~mmpola.models.layers.PreNormBlock`) followed by one that
    ``takes_residual`` returns its last residual connection not added (``defer=True``: ``(x, branch,
    drop_path)``), and the next block adds it (``residual=(branch, drop_path)``), with the LayerNorm before its
    attention's projections: in the LayerNorm's kernel where that runs. Not with ``with_cp``, while a tracer
    records the model, or next to a block with hooks (which see the blocks' usual inputs and outputs).

    ``cast`` (a dtype): returns ``(x, x.to(cast))``, the copy that the next stage reads; the last block, where it
    ``defers_residual`` (and as above), hands its residual connection to :func:`~mmpola.models.layers.add_and_cast`,
    which writes the sum and its copy in one kernel where that runs; with ``as_map``, x in the layout of its
    (B, C, H, W) map (the map's channels-strided tokens view), for a stage output that becomes that map."""
    blocks = list(blocks)
    pending = {}
    for block, following in zip(blocks, blocks[1:] + [None]):
        if with_cp and torch.is_grad_enabled() and x.requires_grad:
            # the backward runs the block's forward again outside this call: in the same recompute_scope
            x = cp.checkpoint(_in_recompute_scope(block, current_recompute_scope()), x, hw, use_reentrant=False,
                              **context)
        elif not with_cp and _hands_residual(block, following, cast is not None):
            x, branch, drop_path = block(x, hw, defer=True, **pending, **context)
            if following is None:
                return add_and_cast(x, branch, drop_path, cast, as_map)
            pending = dict(residual=(branch, drop_path))
        else:
            x, pending = block(x, hw, **pending, **context), {}
    return x if cast is None else (x, x.to(cast))


def check_stage_recompute(recompute, num_stages, name):
    """A backbone's ``recompute``: None or one of :data:`~mmpola.ops.RECOMPUTE_CHOICES` as it is, or a list or tuple of
    one of them (or None) per stage as a tuple; anything else is a config error naming the choices."""
    if recompute is None or isinstance(recompute, str):
        return check_recompute_impl(recompute, PolaConfigError)
    if not isinstance(recompute, (list, tuple)) or len(recompute) != num_stages:
        raise PolaConfigError(f'{name}: recompute takes one value for the whole backbone or a list of one per stage '
                              f'({num_stages} here), got {recompute!r}')
    return tuple(check_recompute_impl(impl, PolaConfigError) for impl in recompute)


def _next_stage_scope(previous, impl):
    """The entered :func:`~mmpola.ops.recompute_scope` of the next stage's ``impl``, ``previous`` (the last stage's,
    or None) left first."""
    if previous is not None:
        previous.__exit__(None, None, None)
    scope = recompute_scope(impl)
    scope.__enter__()
    return scope


def _in_recompute_scope(fn, impl):
    """``fn`` run inside ``recompute_scope(impl)`` (``impl`` None: ``fn`` itself)."""
    if impl is None:
        return fn

    def run(*args, **kwargs):
        with recompute_scope(impl):
            return fn(*args, **kwargs)
    return run


def _hands_residual(block, following, casting=False):
    """Whether ``block`` hands its last residual connection to ``following``, or for the last block (``following``
    None) where ``casting``, to :func:`~mmpola.models.layers.add_and_cast` (:func:`run_blocks`)."""
    if recording() or not getattr(block, 'defers_residual', False):
        return False
    if following is None:
        return casting and not hooked(block)
    if not getattr(following, 'takes_residual', False):
        return False
    return not any(hooked(module) for module in (block, following))



def parse_attn_type(attn_type, depths, linear='L'):
    """Per-block attention letters from the official per-stage ``attn_type`` string.

    One char per stage: ``linear`` (the letter of the configured kind: ``'L'`` Pola / FLatten / PaCS,
    ``'I'`` InLine), ``'S'`` the architecture's softmax, ``'M'`` mixed, where the integer after the
    stage chars gives the number of leading linear blocks of every 'M' stage ("LLMS3": stage 2
    blocks 0-2 linear, the rest softmax).

    Returns:
        list (per stage) of lists (per block) of ``linear`` / 'S'.
    """
    num_stages = len(depths)
    allowed = linear + ''.join(c for c in 'SM' if c != linear)
    if not isinstance(attn_type, str) or len(attn_type) < num_stages:
        raise PolaConfigError(f'attn_type must be a string of {num_stages} chars from "{allowed}" (plus the '
                              f'linear block count for "M" stages, e.g. "{linear * 2}MS3"), got {attn_type!r}')
    stages, suffix = attn_type[:num_stages], attn_type[num_stages:]
    if any(c not in allowed for c in stages):
        raise PolaConfigError(f'attn_type {attn_type!r}: stage chars must be {", ".join(allowed[:-1])} or M '
                              f'({linear}: the configured attention, S: the softmax attention, M: mixed)')
    if 'M' in stages and not suffix.isdigit():
        raise PolaConfigError(f'attn_type {attn_type!r}: an "M" stage needs the number of linear blocks '
                              f'after the stage chars, e.g. "{linear * 2}MS3"')
    if suffix and 'M' not in stages:
        raise PolaConfigError(f'attn_type {attn_type!r}: trailing {suffix!r} without an "M" stage')
    letters = []
    for c, depth in zip(stages, depths):
        if c == 'M':
            letters.append([linear if j < int(suffix) else 'S' for j in range(depth)])
        else:
            letters.append([c] * depth)
    return letters


class DenseBackbone(BaseModule):
    """Base of mmpola's dense backbones (see the module docstring for the architecture contract).

    Common args (keyword-only in the architectures):
        arch: preset name or custom dict (``arch_keys``).
        in_channels: input image channels.
        out_indices: 0-based stages to return (None: the architecture's ``default_out_indices``).
        out_norm: add an output norm to every returned stage (new, dense-only parameters). None:
            the architecture's default (``default_out_norm``).
        frozen_stages: -1 none; 0 the stem; k >= 1 also stages 0..k-1 and their output norms.
            Frozen parts stay in eval mode and without gradients through ``train()``.
        norm_eval: accepted for API compatibility; a no-op for LayerNorm-only architectures.
        with_cp: gradient checkpointing of every block.
        recompute: the linear layers that can recompute their input in the backward (the MLPs' second layer,
            the gated attentions' projection, the linear layers after a LayerNorm): ``'triton'`` (on a GPU the
            backward recomputes it in Triton kernels: less activation memory, more host work per step),
            ``'elementwise'`` (the kernels for the MLPs' second layer, and for the gated projections whose gate
            the attention's kernels do not multiply, the library's LayerNorms: most of that memory for less of that
            work), ``'torch'`` (the library's layers)
            or ``'auto'``; None (default): as ``MMPOLA_RECOMPUTE`` says for the whole run
            (:func:`mmpola.ops.recompute_scope`). A list or tuple of one such value per stage chooses for each
            stage (its patch embedding, blocks and stage norm), e.g. ``('triton', None, None, None)``: the
            kernels where the maps are largest.
        attn: the attention kind of the linear letter and its options: ``'pola'`` or
            ``dict(type='pola', alpha=4.0)`` (any kind registered in
            :data:`mmpola.registry.ATTENTIONS`; its options: :func:`mmpola.models.attention.attention_options`).
            None: the preset's (``default_attn``). A dict without ``type`` sets options of it.
        attn_type: the per-stage layout in the official letters (:func:`parse_attn_type`): the
            letter of the ``attn`` kind, ``'S'`` for the architecture's softmax (``softmax_attn``),
            ``'M'`` mixed. None: the preset's (``default_attn_type``: one string, or one per arch
            size), or every stage ``attn``.
        attn_impl: implementation of every attention op: ``'auto'``, ``'fast'``, ``'reference'``
            (the official op order) or a registered one (mmpola.ops.dispatch).
        fp32_attn: run the attention ops in fp32 under autocast.
        unexpected: the other keyword arguments of the architecture: an error that names the
            attention options and where they go (``attn=dict(...)``).
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH_OR_URL, prefix=None, use_ema=True,
            map_final_norm=False, map_location='cpu', strict=None)`` loads through
            :func:`mmpola.checkpoint.load_checkpoint` (``strict=False``: also the blocks a file of
            another depth or per-stage layout shares with the model, on purpose); other configs go
            to mmengine.

    Stages after ``max(out_indices)`` are built (so checkpoints load unchanged) but not run.
    """

    arch_settings = {}
    arch_keys = ()
    num_stages = 4  # the default of stages_of (an instance sets its own)
    min_input_size = 32
    min_input_reason = 'four stages down to stride 32'
    out_norm_eps = 1e-5
    default_out_norm = False
    init_layers = (nn.Linear,)  # layers of the official trunc-normal init (mmpola.models.layers.trunc_normal_init)
    family = None  # set by register_architecture
    title = None
    # the attention: a preset's defaults, the kind of the letter 'S', the context given to every module
    default_attn = None
    default_attn_type = None
    softmax_attn = 'softmax'
    softmax_name = None  # a file of the softmax-only model in messages (default 'softmax <title>')
    attention_context = ()
    # how the blocks call their attention: the qkv_layout they pass (a kind that lists its layouts in
    # ``qkv_layouts`` must take it) and the prefix tokens in front of the grid tokens (the ViT's class token)
    qkv_layout = 'fused'
    num_prefix_tokens = 0
    # checkpoints: a key every file of the architecture has (for messages), and look-alike files of
    # other libraries {description: regex on the keys} (mmpola.checkpoint names them)
    official_key_pattern = None
    look_alikes = {}
    first_conv = None  # the stem convolution, below ``backbone.`` (timm's pretrained_cfg)
    # name parts of the parameters that the official ImageNet training leaves undecayed besides the 1-D ones (norms
    # and biases): the keys of the Swin training code, which the official repositories train with (docs/recipes.md)
    no_weight_decay_keys = ('absolute_pos_embed', 'relative_position_bias_table')

    def __init__(self, *, arch, in_channels=3, out_indices=(0, 1, 2, 3), out_norm=None,
                 frozen_stages=-1, norm_eval=False, with_cp=False, recompute=None, attn=None, attn_type=None,
                 attn_impl='auto', fp32_attn=True, unexpected=None, init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        name = type(self).__name__
        self.arch = resolve_arch(arch, self.arch_settings, self.arch_keys, name)
        self.arch_name = arch.lower() if isinstance(arch, str) else None
        self.num_stages = self.stages_of(self.arch)
        self.in_channels = in_channels
        if out_indices is None:
            out_indices = self.default_out_indices(self.num_stages)
        self.out_indices = check_out_indices(out_indices, self.num_stages, name)
        self.frozen_stages = check_frozen_stages(frozen_stages, self.num_stages, name)
        self.out_norm = self.default_out_norm if out_norm is None else bool(out_norm)
        self.norm_eval = norm_eval
        self.with_cp = with_cp
        self.recompute = check_stage_recompute(recompute, self.num_stages, name)
        self.attn_impl = check_attn_impl(attn_impl, PolaConfigError)
        self.fp32_attn = fp32_attn
        self.attn_kind, self.attn_options = self._resolve_attention(attn, unexpected or {})
        self.attn_type = attn_type

    # ---------------------------------------------------------------------------------------------
    # the attention

    def _resolve_attention(self, attn, unexpected):
        """(kind, options) of ``attn`` (None: the preset's); ``unexpected`` keyword arguments are an error."""
        default_kind = split_attention_cfg(self.default_attn)[0] if self.default_attn else None
        if attn is None and self.default_attn is None:
            kind, options = None, {}
        else:
            kind, options = split_attention_cfg(attn, default_kind)
        if unexpected:
            valid = attention_options(kind, self.attention_context) if kind else {}
            names = sorted(unexpected)
            title = f'the {attention_title(kind)} attention' if kind else 'this backbone\'s attention'
            # Python's own wording, which the tools turn into a one-line error with the close matches
            raise TypeError(f"{type(self).__name__}.__init__() got an unexpected keyword argument '{names[0]}' "
                            f'(unknown: {", ".join(names)}; {title} options are: '
                            f'{", ".join(valid) or "none"}; pass them as attn=dict(type=..., ...))')
        return kind, options

    def doubling_widths(self):
        """The stage widths of an architecture that doubles the width at every stage (Swin, CSWin),
        from ``arch['embed_dims']``, the stage-1 width."""
        embed_dims = self.arch['embed_dims']
        if not isinstance(embed_dims, int):
            raise PolaConfigError(f'{type(self).__name__}: embed_dims must be the stage-1 width (int), got '
                                  f'{embed_dims!r}')
        return [embed_dims * 2 ** i for i in range(self.num_stages)]

    @property
    def attn_cfg(self):
        """The configured attention as a config dict (``dict(type='pola', alpha=4.0)``), or None."""
        return None if self.attn_kind is None else dict(type=self.attn_kind, **self.attn_options)

    def attention_letters(self):
        """``{letter of attn_type: kind}``: the configured kind's letter and ``'S'`` (softmax)."""
        letters = {'S': self.softmax_attn}
        if self.attn_kind is not None:
            letters[attention_letter(self.attn_kind)] = self.attn_kind
        return letters

    @classmethod
    def stages_of(cls, arch):
        """The number of stages of a resolved arch dict (``num_stages``; the ViT: one per block)."""
        return cls.num_stages

    @classmethod
    def default_out_indices(cls, num_stages):
        """The stages returned when ``out_indices`` is None (of ``num_stages``): all of them."""
        return tuple(range(num_stages))

    def released_attn_type(self):
        """The preset's layout for this arch (``default_attn_type``: a string, or ``{arch: string}``
        whose first entry serves custom arch dicts), or None."""
        layout = self.default_attn_type
        if isinstance(layout, dict):
            return layout.get(self.arch_name, next(iter(layout.values())))
        return layout

    def init_stages(self, keys=None):
        """Set the per-stage settings ``keys`` of the arch (default ``arch_keys``) as list attributes of
        the same names (``self.depths`` ...), each checked to have one entry per stage, then the
        attention kind of every block (:meth:`resolve_block_kinds`)."""
        for key in self.arch_keys if keys is None else keys:
            value = self.arch[key]
            if len(value) != self.num_stages:
                raise PolaConfigError(f'{type(self).__name__}: arch {key} must have {self.num_stages} entries, '
                                      f'got {value!r}')
            setattr(self, key, list(value))
        self.resolve_block_kinds(self.depths)

    def resolve_block_kinds(self, depths):
        """Set ``attn_type`` (default: the preset's, or every stage the configured kind) and
        ``block_kinds``: the kind of every block, a list (per stage) of lists (per block)."""
        linear = attention_letter(self.attn_kind) if self.attn_kind is not None else 'L'
        if self.attn_type is None:
            self.attn_type = self.released_attn_type() or linear * self.num_stages
        letters = parse_attn_type(self.attn_type, depths, linear)
        kinds = self.attention_letters()
        if self.attn_kind is None and any(c == linear for stage in letters for c in stage):
            raise PolaConfigError(f"{type(self).__name__}: attn_type {self.attn_type!r} uses the letter '{linear}' "
                                  "but no attention kind is configured; pass attn=dict(type='pola') (or another "
                                  "registered kind), or attn_type of 'S' stages only")
        self.block_kinds = [[kinds[c] for c in stage] for stage in letters]
        self._check_kinds()
        return self.block_kinds

    @classmethod
    def accepts_kind(cls, kind):
        """Whether attention kind ``kind`` runs in this architecture's blocks: it takes their
        ``qkv_layout`` (a kind without ``qkv_layouts`` owns whatever projections it likes, except on
        CSWin, whose blocks own them) and, for the ViT, prefix tokens."""
        attn = attention_class(kind)
        layouts = getattr(attn, 'qkv_layouts', None)
        if layouts is None and cls.qkv_layout == 'projected':
            return False
        if layouts is not None and cls.qkv_layout not in layouts:
            return False
        return not cls.num_prefix_tokens or getattr(attn, 'prefix_tokens', False)

    def _check_kinds(self):
        """Refuse a layout with a kind that does not run in this architecture's blocks."""
        for kind in sorted({k for stage in self.block_kinds for k in stage}):
            if not self.accepts_kind(kind):
                able = [k for k in registered_attention_kinds() if self.accepts_kind(k)]
                needs = (f"whose blocks call their attention with qkv_layout='{self.qkv_layout}'"
                         + (' and the class token in front of the grid tokens' if self.num_prefix_tokens else ''))
                raise PolaConfigError(f"{type(self).__name__}: the {attention_title(kind)} attention (type='{kind}') "
                                      f'cannot run on {self.title}, {needs}; kinds that can: {", ".join(able)}')

    def build_attention(self, stage, block, dim, num_heads, **context):
        """The attention module of block ``block`` of stage ``stage`` (its kind in ``block_kinds``):
        the configured kind gets its options, every kind the common arguments ``attn_impl``,
        ``fp32_attn`` and ``context`` (the other common arguments and the architecture's context)."""
        kind = self.block_kinds[stage][block]
        cfg = self.attn_cfg if kind == self.attn_kind else kind
        return build_attention(cfg, dim, num_heads, attn_impl=self.attn_impl, fp32_attn=self.fp32_attn, **context)

    def set_attn_impl(self, impl):
        """Switch every attention op between ``'auto'``, ``'fast'``, ``'reference'`` (the official op
        order) or another registered implementation."""
        self.attn_impl = check_attn_impl(impl, PolaConfigError)
        for module in self.modules():
            if module is not self and hasattr(module, 'attn_impl'):
                module.attn_impl = impl

    # ---------------------------------------------------------------------------------------------
    # construction

    def _finish_init(self):
        """Add the output norms, apply the official init, freeze (call at the end of __init__)."""
        if self.out_norm:
            self._add_output_norms()
        self.apply(self.init_module)
        self._freeze_stages()

    def output_norm_name(self, i):
        """The name of stage ``i``'s output norm: ``norm{i}`` (0-based, mmdet's Swin); CSWin ``norm{i+1}``
        (its official dense code's)."""
        return f'norm{i}'

    def _add_output_norms(self):
        """The output norms of the returned stages: LayerNorm :meth:`output_norm_name` (eps ``out_norm_eps``)."""
        for i in self.out_indices:
            self.add_module(self.output_norm_name(i), nn.LayerNorm(self.embed_dims[i], eps=self.out_norm_eps))

    def output_norm(self, i):
        """The output norm of stage ``i``, or None."""
        return getattr(self, self.output_norm_name(i)) if self.out_norm else None

    def init_module(self, module):
        """The official weight init of one module (``model.apply`` runs it on every module)."""
        trunc_normal_init(module, self.init_layers)

    @property
    def out_channels(self):
        """Channels of the returned maps, in ``out_indices`` order (for necks' in_channels)."""
        return [self.embed_dims[i] for i in self.out_indices]

    def dense_only_modules(self):
        """Names of the modules that no classification checkpoint holds (the output norms)."""
        return [self.output_norm_name(i) for i in self.out_indices] if self.out_norm else []

    # ---------------------------------------------------------------------------------------------
    # architecture hooks

    def _stem(self, x):
        raise NotImplementedError

    def _enter_stage(self, i, x, hw):
        raise NotImplementedError

    def _stage_blocks(self, i):
        raise NotImplementedError

    def _exit_stage(self, i, x, hw):
        """Stage ``i``'s blocks' output -> the stage's output (what the next stage and the outputs
        get); the blocks' output by default."""
        return x

    def _block_context(self, i, x, hw):
        """Keyword context every block of stage ``i`` (and its attention) gets; none by default."""
        return {}

    def _stem_parts(self):
        raise NotImplementedError

    def _stage_parts(self, i):
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------------
    # weights

    def init_weights(self):
        """Load ``init_cfg`` type 'Pretrained' with mmpola's loader; other configs go to mmengine."""
        if is_pretrained_cfg(self.init_cfg):
            cfg = dict(check_pretrained_cfg(self.init_cfg, type(self).__name__))
            load_checkpoint(self, cfg['checkpoint'], prefix=cfg.get('prefix'), use_ema=cfg.get('use_ema', True),
                            map_final_norm=cfg.get('map_final_norm', False), strict=cfg.get('strict'),
                            map_location=cfg.get('map_location', 'cpu'))
            self._is_init = True
        else:
            super().init_weights()
        self._freeze_stages()

    def checkpoint_filter(self, state_dict, source='the checkpoint', map_final_norm=False):
        """Official / own checkpoint tensors (backbone keys) -> this model's keys, timm's
        ``checkpoint_filter_fn``: drops the official classification modules (the ``modules`` of
        the architecture's :class:`~mmpola.models.classification_head.ClassificationHead`) and the
        run-time buffers the model does not have; with ``map_final_norm`` the classifier's final
        ``norm.*`` becomes the last output norm (Swin: the trained LN after stage 4). An
        architecture adds its own checks (PVT: the spatial reduction).

        Returns:
            (kept state dict, dropped keys).
        """
        model_state = self.state_dict()
        classification_modules = classification_head_of(self.family).modules
        last_norm = self.output_norm_name(self.num_stages - 1) + '.'
        kept, dropped = {}, []
        for key, value in state_dict.items():
            top = key.split('.', 1)[0]
            mapped = last_norm + key[len('norm.'):]
            if map_final_norm and key.startswith('norm.') and mapped in model_state:
                kept[mapped] = value  # the trained final norm of the classifier as the last output norm
            elif top in classification_modules and key not in model_state:
                dropped.append(key)
            elif key.rsplit('.', 1)[-1] in KeySignature.runtime_buffers and key not in model_state:
                dropped.append(key)
            else:
                kept[key] = value
        return kept, dropped

    @property
    def official_name(self):
        """The model's name as a checkpoint in messages (``'Pola-PVT'``; a preset may name it)."""
        preset = getattr(type(self), 'preset', None)
        if preset is not None and preset.attn == self.attn_kind:
            return preset.official
        if self.attn_kind is None:
            return f'softmax {self.title}'
        return f'{attention_title(self.attn_kind)}-{self.title}'

    def checkpoint_signature(self):
        """What a checkpoint of this model holds (:class:`mmpola.checkpoint.KeySignature`): the key
        patterns outside the attention, the parameter names of each attention kind (the
        softmax's need not be in a file) and the blocks per stage (:class:`mmpola.checkpoint.BlockLayout`)."""
        modules = {}
        for name, module in self.named_modules():
            kind = attention_kind_of(module)
            if kind is not None:
                modules[name] = kind
        kinds = set(modules.values())
        paper = attention_paper(self.attn_kind) if self.attn_kind else ''
        return KeySignature.of_model(self.state_dict(), modules, {k: attention_title(k) for k in kinds},
                                     exclude=self.dense_only_modules(), name=type(self).__name__,
                                     hint=self.official_key_pattern, official=self.official_name, paper=paper,
                                     unchecked=[self.softmax_attn], family=self.family,
                                     letters={k: attention_letter(k) for k in kinds})

    # ---------------------------------------------------------------------------------------------
    # freezing

    def _freeze_stages(self):
        if self.frozen_stages < 0:
            return
        modules, params = self._stem_parts()
        modules, params = list(modules), list(params)
        for i in range(self.frozen_stages):
            m, p = self._stage_parts(i)
            modules += list(m)
            params += list(p)
            if self.out_norm and hasattr(self, self.output_norm_name(i)):
                modules.append(getattr(self, self.output_norm_name(i)))
        for module in modules:
            module.eval()
            for param in module.parameters():
                param.requires_grad = False
        for param in params:
            param.requires_grad = False

    def train(self, mode=True):
        """Set train/eval mode, keeping frozen stages frozen (``norm_eval``: BatchNorms in eval)."""
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for module in self.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()
        return self

    # ---------------------------------------------------------------------------------------------
    # forward

    def forward_stages(self, x, last_stage=None, maps=()):
        """Run the stages 0..last_stage.

        Args:
            x: (B, in_channels, H, W) images.
            last_stage: last 0-based stage to run (default: the last one).
            maps: the stages whose entry the caller turns into a map without a norm (:meth:`stage_map`): their
                tokens may come as that map's channels-strided view, written in its layout by the stage's last
                residual connection (:func:`run_blocks`' ``as_map``, where the next stage reads a copy).

        Returns:
            list of every stage's raw block output (before any downsampling and any output norm),
            in the architecture's form: ``(tokens (B, H_i*W_i, C_i), (H_i, W_i))``, or (B, C_i, H_i, W_i)
            maps for an architecture whose blocks work on maps (:meth:`stage_map` turns either
            into NCHW).
        """
        recompute = self.recompute
        if isinstance(recompute, str) and current_recompute_scope() != recompute:
            with recompute_scope(recompute):  # the backbone's own choice (None: MMPOLA_RECOMPUTE's)
                return self.forward_stages(x, last_stage, maps)
        check_input(x, self.in_channels, self.min_input_size, type(self).__name__, self.min_input_reason)
        last_stage = self.num_stages - 1 if last_stage is None else last_stage
        # one choice per stage: each stage runs inside its own scope (entered here rather than in a `with`
        # around a helper, so that a backbone without one makes no Python call more per step)
        per_stage = recompute if isinstance(recompute, (list, tuple)) else None
        scope = None
        try:
            if per_stage is not None:
                scope = _next_stage_scope(scope, per_stage[0])
            x, hw = self._stem(x)
            outs = []
            for i in range(last_stage + 1):
                if per_stage is not None and i > 0:
                    scope = _next_stage_scope(scope, per_stage[i])
                x, hw = self._enter_stage(i, x, hw)
                # (a tracer's proxy has no dtype to ask, and the traced graph keeps the plain stages)
                cast = self._handoff_dtype(i, x) if i < last_stage and not recording() else None
                x = run_blocks(self._stage_blocks(i), x, hw, self.with_cp, cast, i in maps,
                               **self._block_context(i, x, hw))
                x, copy = x if cast is not None else (x, None)
                x = self._exit_stage(i, x, hw)
                outs.append(self._stage_output(x, hw))
                if copy is not None:  # what the next stage reads
                    x = copy
        finally:
            if scope is not None:
                scope.__exit__(None, None, None)
        return outs

    def _handoff_dtype(self, i, x):
        """The dtype in which stage ``i + 1`` reads the output of stage ``i``'s blocks, where that is not the dtype
        of x (stage i's input) and ``_exit_stage`` leaves the blocks' output as it is: :func:`run_blocks` then
        writes a copy in that dtype with the stage's last residual connection, and ``_enter_stage(i + 1)`` gets
        the copy. None (the default): the output as it is."""
        return None

    def _stage_output(self, x, hw):
        """The :meth:`forward_stages` entry of a stage: (tokens, hw) by default."""
        return x, hw

    def stage_map(self, stage, norm=None):
        """A :meth:`forward_stages` entry -> (B, C, H, W), through ``norm`` (a token norm) first; without one the
        map's gradient comes back to the stage's tokens contiguous (:func:`tokens_to_nchw`, ``grad_as_tokens``)."""
        tokens, hw = stage
        if norm is not None:
            return tokens_to_nchw(norm(tokens), hw)
        return tokens_to_nchw(tokens, hw, grad_as_tokens=True)

    def forward(self, x):
        """(B, C_in, H, W) -> tuple of (B, C_i, H_i, W_i) for i in ``out_indices``."""
        maps = [i for i in self.out_indices if self.output_norm(i) is None]
        stages = self.forward_stages(x, max(self.out_indices), maps)
        return tuple(self.stage_map(stages[i], self.output_norm(i)) for i in self.out_indices)

    # ---------------------------------------------------------------------------------------------
    # the stage maps as timm describes them (feature_info)

    def stage_module(self, i):
        """Name (below the backbone) of the module whose output is stage ``i``'s (timm's feature_info)."""
        raise NotImplementedError

    def stage_stride(self, i):
        """The stride of stage ``i``'s map (4, 8, 16, 32 for the pyramids)."""
        return 4 * 2 ** i

    def depth_groups(self, coarse=False, prefix=''):
        """The parameters' names by depth, as timm groups them for layer-wise lr decay (a classifier's
        ``group_matcher``): the stem's (what ``frozen_stages=0`` freezes) first, then one list per block in the
        order the blocks run, or with ``coarse`` one per stage. A stage's other parameters go with its first block
        where they are registered before its blocks (a patch embedding, a merging before the stage, PVT's
        positional encoding) and with its last block otherwise (a downsampling or a stage norm after the blocks).
        Parameters of no stage (the output norms of a dense backbone) are in none. ``prefix``: before each name."""
        names = {id(p): prefix + n for n, p in self.named_parameters()}
        order = {key: k for k, key in enumerate(names)}

        def owned(parts):
            modules, params = parts
            return [id(p) for m in modules for p in m.parameters()] + [id(p) for p in params]

        groups = [owned(self._stem_parts())]
        for i in range(self.num_stages):
            blocks = [owned(([block], ())) for block in self._stage_blocks(i)]
            in_blocks = {key for block in blocks for key in block}
            rest = [key for key in owned(self._stage_parts(i)) if key not in in_blocks]
            if coarse or not blocks:
                groups.append([key for block in blocks for key in block] + rest)
                continue
            first = min((order[key] for key in blocks[0]), default=-1)
            blocks[0] = [key for key in rest if order[key] < first] + blocks[0]
            blocks[-1] = blocks[-1] + [key for key in rest if order[key] > first]
            groups.extend(blocks)
        return [[names[key] for key in group] for group in groups]

    def feature_info(self, prefix=''):
        """timm's description of the stage maps: ``dict(num_chs, reduction, module)`` per stage,
        ``module`` named below ``prefix``."""
        return [dict(num_chs=c, reduction=self.stage_stride(i), module=prefix + self.stage_module(i))
                for i, c in enumerate(self.embed_dims)]
