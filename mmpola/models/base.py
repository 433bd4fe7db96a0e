"""The shared core of mmpola's dense backbones (PVT family, Swin family, and any new family).

:class:`DenseBackbone` holds what every backbone has in common, so a family file keeps only what
is its own (its modules, how a stage is entered, which parts a frozen stage covers):

* arguments: ``arch`` presets / custom dicts, ``out_indices``, ``frozen_stages``, ``out_norm``
  (deprecated alias ``norm_after_stage``), ``norm_eval`` (a no-op), ``with_cp``, ``pretrained``
  (deprecated alias of ``init_cfg``), with clear errors;
* the stage loop with input checks and gradient checkpointing of every block
  (:meth:`forward_stages`), the tokens -> NCHW outputs with optional output norms
  (:meth:`forward`), ``out_channels``;
* ``init_weights`` with ``init_cfg=dict(type='Pretrained', checkpoint=...)`` through
  :func:`mmpola.checkpoint.load_pola_checkpoint` (which refuses checkpoints of another attention
  kind or family), ``set_attn_impl``, freezing kept through ``train()``;
* the stochastic-depth schedule (:func:`drop_path_rates`).

Subclass contract (a family)::

    class MyFamily(DenseBackbone):
        arch_settings = {'tiny': dict(...)}     # presets; arch_keys: the keys of a custom dict
        arch_keys = ('embed_dims', 'depths', 'num_heads')
        out_norm_eps = 1e-5                     # LayerNorm eps of the output norms ``norm{i}``
        default_out_norm = True                 # out_norm=None means this

        def __init__(self, arch='tiny', ..., **common):
            super().__init__(arch=arch, **common)    # checks and stores the common arguments;
            ...                                      # self.arch is the resolved arch dict
            self.embed_dims = [...]                  # channels of the four stages
            # build the modules, then:
            self._finish_init()                      # output norms, official init, freezing

        def _stem(self, x):              # image -> (x, hw) given to stage 0
        def _enter_stage(self, i, x, hw):   # output of stage i - 1 (or the stem) -> input of stage i
        def _stage_blocks(self, i):      # the blocks of stage i: each is called block(x, hw)
        def _stem_parts(self):           # (modules, parameters) frozen by frozen_stages >= 0
        def _stage_parts(self, i):       # (modules, parameters) of stage i, frozen when i < frozen_stages

A family picks attention modules from :mod:`mmpola.models.attention_kinds` by the official
per-stage letters (``attn_kind`` is the family member's linear attention, e.g. ``'pola'``).
Input: (B, in_channels, H, W) with H, W >= ``min_input_size``. Output: a tuple of NCHW maps for
``out_indices``.
"""
import warnings

import torch
import torch.utils.checkpoint as cp
from mmengine.model import BaseModule

from mmpola.ops.dispatch import check_attn_impl

from .attention_kinds import get_attention_kind
from .layers import init_official_weights
from .utils import (
    PolaConfigError,
    check_frozen_stages,
    check_input,
    check_out_indices,
    is_pretrained_cfg,
    pretrained_alias,
    resolve_arch,
)

__all__ = ['DenseBackbone', 'drop_path_rates', 'tokens_to_nchw', 'run_blocks', 'resolve_out_norm']



def drop_path_rates(drop_path_rate, depths):
    """Stochastic depth rising linearly over all blocks (the official rule), split per stage."""
    total = sum(depths)
    rates = torch.linspace(0, drop_path_rate, total, device='cpu').tolist() if total > 1 else [0.0] * total
    out, cur = [], 0
    for depth in depths:
        out.append(rates[cur:cur + depth])
        cur += depth
    return out


def tokens_to_nchw(tokens, hw):
    """(B, H*W, C) row-major tokens and (H, W) -> contiguous (B, C, H, W)."""
    return tokens.reshape(tokens.shape[0], hw[0], hw[1], -1).permute(0, 3, 1, 2).contiguous()


def run_blocks(blocks, x, hw, with_cp=False):
    """``x = block(x, hw)`` for every block, each checkpointed when ``with_cp`` and training."""
    for block in blocks:
        if with_cp and torch.is_grad_enabled() and x.requires_grad:
            x = cp.checkpoint(block, x, hw, use_reentrant=False)
        else:
            x = block(x, hw)
    return x


def resolve_out_norm(out_norm, norm_after_stage, default):
    """``out_norm`` with its deprecated alias ``norm_after_stage`` (kept for one release)."""
    if norm_after_stage is not None:
        if out_norm is not None and bool(out_norm) != bool(norm_after_stage):
            raise PolaConfigError(f'out_norm={out_norm} and its deprecated alias norm_after_stage='
                                  f'{norm_after_stage} disagree; pass only out_norm')
        warnings.warn('norm_after_stage is deprecated; use out_norm (the same option)', DeprecationWarning)
        return bool(norm_after_stage)
    return default if out_norm is None else bool(out_norm)


class DenseBackbone(BaseModule):
    """Base of mmpola's dense backbones (see the module docstring for the subclass contract).

    Common args (keyword-only in subclasses):
        arch: preset name or custom dict (``arch_keys``).
        in_channels: input image channels.
        out_indices: 0-based stages to return.
        out_norm: add a LayerNorm ``norm{i}`` (eps ``out_norm_eps``) to every returned stage (new,
            dense-only parameters). None: the family default (``default_out_norm``).
        norm_after_stage: deprecated alias of ``out_norm``.
        frozen_stages: -1 none; 0 the stem; k >= 1 also stages 0..k-1 and their output norms.
            Frozen parts stay in eval mode and without gradients through ``train()``.
        norm_eval: accepted for API compatibility; a no-op (LayerNorm only, no running stats).
        with_cp: gradient checkpointing of every block.
        pretrained: deprecated alias of ``init_cfg=dict(type='Pretrained', checkpoint=...)``.
        init_cfg: ``dict(type='Pretrained', checkpoint=PATH_OR_URL, prefix=None, use_ema=True,
            map_final_norm=False, map_location='cpu')`` loads through
            :func:`mmpola.checkpoint.load_pola_checkpoint`; other configs go to mmengine.

    Stages after ``max(out_indices)`` are built (so checkpoints load unchanged) but not run.
    """

    arch_settings = {}
    arch_keys = ()
    num_stages = 4
    min_input_size = 32
    out_norm_eps = 1e-5
    default_out_norm = False
    attn_kind = None  # the family member's linear attention kind (mmpola.models.attention_kinds)
    # for the loader's messages
    official_name = None
    official_key_pattern = None

    def __init__(self, *, arch, in_channels=3, out_indices=(0, 1, 2, 3), out_norm=None, norm_after_stage=None,
                 frozen_stages=-1, norm_eval=False, with_cp=False, pretrained=None, init_cfg=None):
        init_cfg = pretrained_alias(pretrained, init_cfg)
        super().__init__(init_cfg=init_cfg)
        name = type(self).__name__
        self.arch = resolve_arch(arch, self.arch_settings, self.arch_keys, name)
        self.in_channels = in_channels
        self.out_indices = check_out_indices(out_indices, self.num_stages, name)
        self.frozen_stages = check_frozen_stages(frozen_stages, self.num_stages, name)
        self.out_norm = resolve_out_norm(out_norm, norm_after_stage, self.default_out_norm)
        self.norm_eval = norm_eval  # no-op: LayerNorm only
        self.with_cp = with_cp

    @classmethod
    def attention_letters(cls):
        """``{letter of the official attn_type strings: attention kind}`` of this backbone: the
        letter of ``attn_kind`` and ``'S'`` (softmax)."""
        letters = {'S': 'softmax'}
        if cls.attn_kind is not None:
            letters[get_attention_kind(cls.attn_kind).letter] = cls.attn_kind
        return letters

    @classmethod
    def check_attn_options(cls, options):
        """Refuse keyword arguments that are neither common nor options of ``attn_kind``."""
        valid = get_attention_kind(cls.attn_kind).options if cls.attn_kind else {}
        unknown = sorted(set(options) - set(valid))
        if unknown:
            title = get_attention_kind(cls.attn_kind).title if cls.attn_kind else 'this backbone'
            # Python's own wording, which the tools turn into a one-line error with the close matches
            raise TypeError(f"{cls.__name__}.__init__() got an unexpected keyword argument '{unknown[0]}' "
                            f'(unknown: {", ".join(unknown)}; the {title} attention options are: '
                            f'{", ".join(valid) or "none"})')

    @property
    def norm_after_stage(self):
        """Deprecated alias of ``out_norm``."""
        return self.out_norm

    def _finish_init(self):
        """Add the output norms, apply the official init, freeze (call at the end of __init__)."""
        if self.out_norm:
            for i in self.out_indices:
                self.add_module(f'norm{i}', torch.nn.LayerNorm(self.embed_dims[i], eps=self.out_norm_eps))
        self.apply(init_official_weights)
        self._freeze_stages()

    @property
    def out_channels(self):
        """Channels of the returned maps, in ``out_indices`` order (for necks' in_channels)."""
        return [self.embed_dims[i] for i in self.out_indices]

    # ---------------------------------------------------------------------------------------------
    # family hooks

    def _stem(self, x):
        raise NotImplementedError

    def _enter_stage(self, i, x, hw):
        raise NotImplementedError

    def _stage_blocks(self, i):
        raise NotImplementedError

    def _stem_parts(self):
        raise NotImplementedError

    def _stage_parts(self, i):
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------------
    # weights

    def init_weights(self):
        """Load ``init_cfg`` type 'Pretrained' with mmpola's loader; other configs go to mmengine."""
        if is_pretrained_cfg(self.init_cfg):
            from mmpola.checkpoint import load_pola_checkpoint
            cfg = dict(self.init_cfg)
            load_pola_checkpoint(self, cfg['checkpoint'], prefix=cfg.get('prefix'),
                                 use_ema=cfg.get('use_ema', True),
                                 map_final_norm=cfg.get('map_final_norm', False),
                                 map_location=cfg.get('map_location', 'cpu'))
            self._is_init = True
        else:
            super().init_weights()
        self._freeze_stages()

    def set_attn_impl(self, impl):
        """Switch every attention core between ``'auto'``, ``'fast'`` and ``'reference'`` (the
        official op order)."""
        check_attn_impl(impl, PolaConfigError)
        for module in self.modules():
            if module is not self and hasattr(module, 'attn_impl'):
                module.attn_impl = impl

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
            if hasattr(self, f'norm{i}'):
                modules.append(getattr(self, f'norm{i}'))
        for module in modules:
            module.eval()
            for param in module.parameters():
                param.requires_grad = False
        for param in params:
            param.requires_grad = False

    def train(self, mode=True):
        """Set train/eval mode, keeping frozen stages frozen (``norm_eval`` has nothing to do)."""
        super().train(mode)
        self._freeze_stages()
        return self

    # ---------------------------------------------------------------------------------------------
    # forward

    def forward_stages(self, x, last_stage=None):
        """Run the stages 0..last_stage.

        Args:
            x: (B, in_channels, H, W) images.
            last_stage: last 0-based stage to run (default: the last one).

        Returns:
            list of (tokens (B, H_i*W_i, C_i), (H_i, W_i)): every stage's raw block output (before
            any downsampling and any output norm).
        """
        check_input(x, self.in_channels, self.min_input_size, type(self).__name__)
        last_stage = self.num_stages - 1 if last_stage is None else last_stage
        x, hw = self._stem(x)
        outs = []
        for i in range(last_stage + 1):
            x, hw = self._enter_stage(i, x, hw)
            x = run_blocks(self._stage_blocks(i), x, hw, self.with_cp)
            outs.append((x, hw))
        return outs

    def forward(self, x):
        """(B, C_in, H, W) -> tuple of (B, C_i, H_i, W_i) for i in ``out_indices``."""
        stages = self.forward_stages(x, max(self.out_indices))
        outs = []
        for i in self.out_indices:
            tokens, hw = stages[i]
            if self.out_norm:
                tokens = getattr(self, f'norm{i}')(tokens)
            outs.append(tokens_to_nchw(tokens, hw))
        return tuple(outs)
