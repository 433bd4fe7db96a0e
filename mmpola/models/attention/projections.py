"""How the linear attention kinds get their operands: the projection layouts (``qkv_layout``) under the
official names (``qkvg``, ``qg``, ``q``, ``kv``, ``qkv``), the checks of their arguments, and PVT's spatial
reduction of the keys and values (``sr``, ``norm``), so official checkpoints load by filtering keys."""
import torch.nn as nn

from ..layers import gated_proj, gated_proj_recomputes, map_as_tokens, norm_linear, tokens_as_map

__all__ = ['QKV_LAYOUTS', 'QKVProjections', 'check_attention_args', 'reduced_grid', 'spatial_reduction']


# 'fused': one projection of the tokens gives every operand (Swin, PolaFormer++, the ViT: ``qkv`` /
# ``qkvg``); 'separate': queries from the tokens, keys and values from a second projection ``kv`` of
# the (optionally spatially reduced) map (PVT, PVTv2: ``q`` / ``qg`` and ``kv``); 'projected': the
# module gets the operands already projected, x (B, N, P, C) with P = its ``projections`` (q, k, v;
# Pola also g) or those P operands (B, N, C) as a tuple, and returns (B, N, C) before any output
# projection: it owns neither the input projections nor ``proj`` (CSWin, whose block shares one ``qkv``
# and one ``proj`` between its branches; docs/design.md, "CSWin: the block owns the projections")
QKV_LAYOUTS = ('fused', 'separate', 'projected')


def check_attention_args(dim, num_heads, qkv_layout='fused', sr_ratio=1, v_upsample='linear1d'):
    """The argument checks the linear attention modules share; returns the head dim."""
    if dim % num_heads:
        raise ValueError(f'dim {dim} is not divisible by num_heads {num_heads}')
    if qkv_layout not in QKV_LAYOUTS:
        raise ValueError(f"qkv_layout must be 'fused' (Swin, ViT), 'separate' (PVT) or 'projected' (CSWin), got "
                         f'{qkv_layout!r}')
    if sr_ratio > 1 and qkv_layout != 'separate':
        raise ValueError("spatial reduction (sr_ratio > 1) needs the separate key/value projection (PVT's "
                         "qkv_layout='separate')")
    if v_upsample not in ('linear1d', 'bilinear2d'):
        raise ValueError(f"v_upsample must be 'linear1d' or 'bilinear2d', got {v_upsample!r}")
    return dim // num_heads


class QKVProjections:
    """Mixin of the linear attention modules: the projections of ``qkv_layout`` (``QKV_LAYOUTS``) under
    the official names. ``fused_projection`` = (name, operands) of the 'fused' Linear (``('qkv', 3)``;
    Pola ``('qkvg', 4)``, the operands q, k, v, g); ``query_projection`` = (name, operands) of the
    'separate' layout's Linear of the tokens (``('q', 1)``; Pola ``('qg', 2)``, q and g), beside ``kv``
    Linear(C, 2C) of the (optionally spatially reduced: ``sr`` / ``norm``) map."""

    fused_projection = ('qkv', 3)
    query_projection = ('q', 1)
    # whether the module uses its input only through the projections, so that a block may hand it the input
    # and the LayerNorm before it (``forward(x, hw, norm=...)``, :attr:`takes_norm`)
    input_only_projected = False

    @property
    def _projects_the_tokens_only(self):
        """Every projection takes the tokens themselves: the 'fused' layout, or the 'separate' one without a
        spatial reduction of the keys."""
        return self.qkv_layout == 'fused' or self.qkv_layout == 'separate' and getattr(self, 'sr', None) is None

    @property
    def takes_norm(self):
        """True where the block may call ``attn(x, hw, norm=norm1)`` instead of ``attn(norm1(x), hw)``: for a
        module that uses its input only through its projections, all of the tokens themselves, which then
        take the LayerNorm with them (:func:`~mmpola.models.layers.norm_linear`)."""
        return self.input_only_projected and self._projects_the_tokens_only

    @property
    def takes_branch(self):
        """True where the block may also hand the module the residual connection before that LayerNorm,
        ``attn(x, hw, norm=norm1, branch=b, drop_path=dp)`` for the input ``x + dp(b)``, which then returns
        ``(x + dp(b), out)`` (where its kernels run, the LayerNorm's kernel adds it: :func:`norm_linear`'s
        ``branch``): as :attr:`takes_norm`."""
        return self.takes_norm

    def _init_input_projections(self, dim, qkv_layout, qkv_bias):
        if qkv_layout == 'fused':
            name, operands = self.fused_projection
            setattr(self, name, nn.Linear(dim, dim * operands, bias=qkv_bias))
        elif qkv_layout == 'separate':
            name, operands = self.query_projection
            setattr(self, name, nn.Linear(dim, dim * operands, bias=qkv_bias))
            self.kv = nn.Linear(dim, dim * 2, bias=qkv_bias)

    def _init_output_projection(self, dim, qkv_layout, proj_drop):
        if qkv_layout != 'projected':
            self.proj = nn.Linear(dim, dim)
            self.proj_drop = nn.Dropout(proj_drop)

    def _project_inputs(self, x, hw, norm=None, value_twice=False, branch=None, drop_path=None, stream=False):
        """(the operands (B, N, C) each, in the order of the fused projection; k and v: (B, n, C)),
        (Hk, Wk) the key grid; ``norm``: a LayerNorm to apply to x first (the projections take it with them
        where :attr:`takes_norm`: :func:`~mmpola.models.layers.norm_linear`). ``value_twice``: v once more after
        the operands, for a second use of the values (the depthwise term), whose gradient the projection's
        backward adds to the first's where its kernels run (:func:`~mmpola.models.layers.norm_linear`'s
        ``repeat``); elsewhere the same tensor. ``branch`` (where :attr:`takes_branch`, with ``norm``): the
        residual connection before the norm, ``x + drop_path(branch)`` the input; then returns that sum first,
        (sum, operands, key grid). ``stream`` (likewise): no branch, x itself returned first, the residual stream
        going on past the norm (:func:`~mmpola.models.layers.norm_linear`'s ``stream``)."""
        if (branch is not None or stream) and not (norm is not None and self.takes_branch):
            raise ValueError(f'{type(self).__name__} takes a branch with the LayerNorm of its projections only '
                             '(takes_branch)')
        tokens_only = self._projects_the_tokens_only
        if norm is not None and not tokens_only:
            x, norm = norm(x), None
        value = 2  # the values' index in the order of the fused projection (q, k, v, ...)
        if self.qkv_layout == 'projected':
            operands = self.fused_projection[1]
            if isinstance(x, (tuple, list)):  # taken apart by the caller (CSWin's block, which uses v itself)
                operands = tuple(x[:operands])
            else:
                operands = x[:, :, :operands].unbind(2)
            return operands + (operands[value], ) * value_twice, tuple(hw)
        B, N, C = x.shape
        returns_x = branch is not None or stream
        residual = dict(branch=branch, drop_path=drop_path, stream=stream)
        if self.qkv_layout == 'fused':
            name, _ = self.fused_projection
            projected = norm_linear(norm, getattr(self, name), x, chunk=C, repeat=(value, ) * value_twice,
                                    **residual)
            return (*projected, tuple(hw)) if returns_x else (projected, tuple(hw))
        name, operands = self.query_projection
        if tokens_only:  # no spatial reduction: both projections of the (normalised) tokens, one product
            # their order q, (g), k, v: the values are the last of the query projection's operands and k
            projected = norm_linear(norm, (getattr(self, name), self.kv), x, chunk=C,
                                    repeat=(operands + 1, ) * value_twice, **residual)
            s, projected = projected if returns_x else (None, projected)
            query, (k, v), again = projected[:operands], projected[operands:operands + 2], projected[operands + 2:]
            projected = (query[0], k, v, *query[1:], *again)
            return (s, projected, tuple(hw)) if returns_x else (projected, tuple(hw))
        query = getattr(self, name)(x)
        query = (query,) if operands == 1 else query.reshape(B, N, operands, C).unbind(2)
        x_, kv_hw = spatial_reduction(x, hw, getattr(self, 'sr', None), getattr(self, 'norm', None))
        k, v = self.kv(x_).reshape(B, -1, 2, C).unbind(2)
        return (query[0], k, v, *query[1:]) + (v, ) * value_twice, kv_hw

    def _project_output(self, out):
        """``proj`` and its dropout, except in the 'projected' layout (the caller owns ``proj``)."""
        if self.qkv_layout == 'projected':
            return out
        return self.proj_drop(self.proj(out))

    def _function_takes_gate(self, out):
        """Whether a Function that computes ``out`` multiplies it by the gate itself (:meth:`_project_output` after
        it): in the 'projected' layout, and wherever :func:`~mmpola.models.layers.gated_proj_recomputes` leaves
        the gate to such a Function (its ``joins``; else :meth:`_project_gated_output` gives it to
        :func:`~mmpola.ops.gated_linear`'s kernels)."""
        return self.qkv_layout == 'projected' or not gated_proj_recomputes(out, self.proj, joins=True)

    def _project_gated_output(self, out, gate):
        """``_project_output(out * gate)``, by :func:`~mmpola.models.layers.gated_proj` where there is a ``proj``."""
        if self.qkv_layout == 'projected':
            return out * gate
        return self.proj_drop(gated_proj(out, gate, self.proj))


def reduced_grid(pe_grid, sr_ratio):
    """The key grid of a ``pe_grid`` map after a spatial reduction by ``sr_ratio``."""
    return tuple(side // sr_ratio for side in pe_grid)


def spatial_reduction(x, hw, sr, norm):
    """Keys/values source of PVT attention: (B, N, C) -> ``sr`` conv (k = s = r) -> LayerNorm.

    Returns (tokens (B, n, C), (Hk, Wk)); the input itself when ``sr`` is None.
    """
    if sr is None:
        return x, tuple(hw)
    x = sr(tokens_as_map(x, hw))
    return norm(map_as_tokens(x)), tuple(x.shape[-2:])
