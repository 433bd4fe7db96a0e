"""Attention kinds: one ``nn.Module`` per kind, registered in :data:`mmpola.registry.ATTENTIONS`
under a short name, all with one calling convention ``attn(x, hw, **context) -> (B, N, C)``
(:mod:`.builder` documents the contract and how a backbone builds them).

============== ======== ================================================================
kind           letter   module
============== ======== ================================================================
pola           L        :class:`PolaAttention` (PolaFormer)
flatten        L        :class:`FocusedLinearAttention` (FLatten Transformer)
inline         I        :class:`InLineAttention` (InLine)
pacs           L        :class:`PaCSAttention` (PolaFormer++)
softmax        S        :class:`SpatialReductionAttention` (PVT's, PVTv2's and the ViT's softmax)
window_softmax S        :class:`WindowAttention` (Swin's shifted-window softmax)
stripe_softmax S        :class:`StripeAttention` (CSWin's cross-shaped stripes with LePE)
rope_softmax   S        :class:`RoPESoftmaxAttention` (PolaFormer++'s softmax)
============== ======== ================================================================
"""
from .builder import (
    COMMON_ARGS,
    attention_citation,
    attention_class,
    attention_kind_of,
    attention_letter,
    attention_op,
    attention_options,
    attention_paper,
    attention_publication,
    attention_title,
    build_attention,
    registered_attention_kinds,
    split_attention_cfg,
)
from .flatten import FocusedLinearAttention
from .inline import InLineAttention
from .pacs import PaCSAttention, RoPESoftmaxAttention, RotaryEmbedding
from .pola import PolaAttention
from .softmax import SpatialReductionAttention, StripeAttention, WindowAttention

__all__ = ['COMMON_ARGS', 'attention_citation', 'attention_class', 'attention_kind_of', 'attention_letter',
           'attention_op', 'attention_options', 'attention_paper', 'attention_publication', 'attention_title',
           'build_attention', 'registered_attention_kinds', 'split_attention_cfg',
           'PolaAttention', 'FocusedLinearAttention', 'InLineAttention', 'PaCSAttention', 'RoPESoftmaxAttention',
           'RotaryEmbedding', 'SpatialReductionAttention', 'StripeAttention', 'WindowAttention']
