"""Helpers of the linear attention cores for working on all heads at once in the (B, N, C) layout."""
import torch

__all__ = ['BLOCK_DIAG_MAX_HEADS', 'block_diagonal_mask', 'head_indicator']

# Up to this many heads the per-head (d, d) matrices of a linear attention are multiplied as one
# block-diagonal (C, C) matrix: h times the (small) matmul work of separate heads, but q, k, v and the
# output keep their (B, N, C) layout, which saves the head split and merge copies of every large tensor.
BLOCK_DIAG_MAX_HEADS = 4


def head_indicator(channels, num_heads, like):
    """(C, h) float matrix: 1 where channel c belongs to head j (channels split in equal runs)."""
    heads = torch.arange(channels, device=like.device) // (channels // num_heads)
    return (heads[:, None] == torch.arange(num_heads, device=like.device)).to(like.dtype)


def block_diagonal_mask(channels, num_heads, like):
    """(C, C) float mask: 1 inside the h diagonal (d, d) blocks, 0 elsewhere."""
    ind = head_indicator(channels, num_heads, like)
    return ind @ ind.T
