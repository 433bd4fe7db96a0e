"""Attention ops: pure functions on tensors, each with an implementation table (mmpola.ops.dispatch).

=========== ============================= ==========================================================
op          public function               layout
=========== ============================= ==========================================================
``pola``    :func:`pola_attention`        per head: q (B, h, N, d), k, v (B, h, n, d)
``flatten`` :func:`flatten_attention`     heads merged: q (B, N, C), k, v (B, n, C)
``inline``  :func:`inline_attention`      heads merged: q (B, N, C), k, v (B, n, C)
``pacs``    :func:`pacs_attention`        per head: q, k, v (B, h, N, d) plus (N, 2d) RoPE tables
=========== ============================= ==========================================================

Beside them, :func:`depthwise_conv2d` (mmpola/ops/depthwise.py): the depthwise convolution of the token
maps, by the library or by Triton kernels; and :func:`gelu_linear` / :func:`gated_linear` /
:func:`layer_norm_linear` / :func:`add_layer_norm_linear` (mmpola/ops/recompute.py): the MLPs' GELU and
second linear layer, Pola's gated output projection and a LayerNorm with the linear layer after it (also
with the residual connection before it), whose backward can recompute the linear layer's input instead of
keeping it; :func:`add_residual_and_cast`, a stage's last residual connection written with its copy in
the dtype the next stage reads; and :func:`layer_norm_add`, a patch embedding's LayerNorm with the positional
encoding added. mmpola/ops/value_term_triton.py joins Pola's and FLatten's Triton cores with their depthwise value
term, InLine's with its local residual and PaCS's with its LePE, in one autograd Function, which their attention
modules call where both run in Triton. :func:`scaled_dot_product_attention` (mmpola/ops/sdpa.py), through which
the softmax kinds attend, is torch's with cuDNN's attention left out on CUDA by default (it builds a graph per input
size).
"""
from .depthwise import DEPTHWISE_IMPLS, depthwise_conv2d, depthwise_conv_impl
from .dispatch import OPS, attention_impls, attention_op, check_attn_impl, register_attention_impl
from .flatten import flatten_attention, flatten_attention_fast, flatten_attention_reference, focused_feature_map
from .flatten_triton import flatten_attention_triton
from .inline import inline_attention, inline_attention_fast, inline_attention_reference
from .inline_triton import inline_attention_triton
from .pacs import (
    pacs_attention,
    pacs_attention_fast,
    pacs_attention_reference,
    rope_angles,
    rope_rotate,
    rope_rotate_fast,
    rope_tables,
)
from .pacs_triton import pacs_attention_triton
from .pola import (
    compile_status,
    pola_attention,
    pola_attention_fast,
    pola_attention_reference,
    polarity_feature_map,
    polarity_feature_map_and_mean,
)
from .pola_triton import pola_attention_triton
from .recompute import (
    RECOMPUTE_CHOICES,
    RECOMPUTE_IMPLS,
    add_layer_norm_linear,
    add_residual_and_cast,
    check_recompute_impl,
    current_recompute_scope,
    gated_linear,
    gelu_linear,
    layer_norm_add,
    layer_norm_linear,
    recompute_impl,
    recompute_impl_from_env,
    recompute_scope,
)
from .sdpa import SDPA_IMPLS, scaled_dot_product_attention, sdpa_impl
from .triton_support import autotune_asked

# the environment variables that choose an implementation of mmpola's ops for a whole run, each with the function
# that reads it (and refuses an unknown value in one line); a backbone's ``recompute`` argument overrides
# MMPOLA_RECOMPUTE for that backbone
IMPLEMENTATION_VARIABLES = {'MMPOLA_DEPTHWISE_CONV': depthwise_conv_impl, 'MMPOLA_RECOMPUTE': recompute_impl_from_env,
                            'MMPOLA_SDPA': sdpa_impl}


def implementation_note():
    """One line for a run's log: the implementation each of :data:`IMPLEMENTATION_VARIABLES` chooses ('auto' where
    unset) and whether Triton's kernels tune (``MMPOLA_TRITON_AUTOTUNE``). Speed and memory depend on them, and a
    log that names them tells two runs apart. An unknown value raises its one-line error, before anything runs."""
    chosen = ', '.join(f'{variable}={read()}' for variable, read in IMPLEMENTATION_VARIABLES.items())
    return (f"op implementations: {chosen}; Triton's tuning {'on' if autotune_asked() else 'off'} "
            '(MMPOLA_TRITON_AUTOTUNE)')

__all__ = [
    'OPS', 'attention_op', 'attention_impls', 'register_attention_impl', 'check_attn_impl',
    'pola_attention', 'pola_attention_reference', 'pola_attention_fast', 'polarity_feature_map',
    'pola_attention_triton', 'polarity_feature_map_and_mean', 'compile_status',
    'flatten_attention', 'flatten_attention_reference', 'flatten_attention_fast', 'flatten_attention_triton',
    'focused_feature_map',
    'inline_attention', 'inline_attention_reference', 'inline_attention_fast', 'inline_attention_triton',
    'pacs_attention', 'pacs_attention_reference', 'pacs_attention_fast', 'pacs_attention_triton', 'rope_angles',
    'rope_tables', 'rope_rotate', 'rope_rotate_fast', 'DEPTHWISE_IMPLS', 'depthwise_conv2d', 'depthwise_conv_impl',
    'RECOMPUTE_CHOICES', 'RECOMPUTE_IMPLS', 'add_layer_norm_linear', 'add_residual_and_cast', 'check_recompute_impl',
    'current_recompute_scope', 'gelu_linear', 'gated_linear', 'layer_norm_add', 'layer_norm_linear', 'recompute_impl',
    'recompute_impl_from_env', 'recompute_scope', 'SDPA_IMPLS', 'scaled_dot_product_attention', 'sdpa_impl',
    'IMPLEMENTATION_VARIABLES', 'implementation_note'
]
