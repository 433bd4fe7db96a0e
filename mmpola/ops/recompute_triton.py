"""The backward kernels of the linear layers whose input is recomputed (``impl='triton'`` of
:mod:`mmpola.ops.recompute`).

Each reads what the forward kept and the gradient of the linear layer's input, and writes in one pass both
that input, recomputed (for the layer's weight gradient), and the gradients of what it was made from:

* ``_gelu_and_backward_kernel``: from h, ``a = GELU(h)`` and ``dL/dh``, as torch's exact GELU computes them
  in float32: ``cdf = (1 + erf(x / sqrt(2))) / 2``, ``a = x * cdf``,
  ``dL/dh = dL/da * (cdf + x * exp(-x^2 / 2) / sqrt(2 pi))``. Flat contiguous tensors.
* ``_gate_and_backward_kernel``: from s and g, ``p = s * g``, ``dL/ds = dL/dp * g`` and ``dL/dg = dL/dp * s``
  (one float32 product each, as torch's multiplication and its backward). (M, C) rows read through a row
  stride (a gate seen in its projection), written contiguous.

Every result is rounded once to its tensor's dtype. Any number of elements; float64 inputs (the
interpreter, for tests) are computed in float32 too. One compiled kernel per dtype (and the gate's per
channel count): the token count is data, not a specialisation.
"""
import torch

from .triton_support import launch, triton_available

__all__ = ['gate_and_gate_backward', 'gelu_and_gelu_backward']

if triton_available() is None:
    import triton
    import triton.language as tl

    @triton.jit  # n: a multiple of the hidden width (a multiple of 16 in every model), so one variant
    def _gelu_and_backward_kernel(h_ptr, grad_ptr, out_ptr, grad_h_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(h_ptr + offsets, mask=mask, other=0.).to(tl.float32)
        dy = tl.load(grad_ptr + offsets, mask=mask, other=0.).to(tl.float32)
        cdf = 0.5 * (1. + tl.math.erf(x * 0.7071067811865476))  # 1 / sqrt(2)
        pdf = tl.exp(-0.5 * x * x) * 0.3989422804014327  # 1 / sqrt(2 pi)
        tl.store(out_ptr + offsets, (x * cdf).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(grad_h_ptr + offsets, (dy * (cdf + x * pdf)).to(grad_h_ptr.dtype.element_ty), mask=mask)

    @triton.jit(do_not_specialize=['M'])  # the token count: data; the channels and row strides specialise
    def _gate_and_backward_kernel(s_ptr, g_ptr, grad_ptr, out_ptr, grad_s_ptr, grad_g_ptr, M, C, s_row, g_row,
                                  BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
        rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = (rows[:, None] < M) & (cols[None, :] < C)
        s = tl.load(s_ptr + rows[:, None] * s_row + cols[None, :], mask=mask, other=0.).to(tl.float32)
        g = tl.load(g_ptr + rows[:, None] * g_row + cols[None, :], mask=mask, other=0.).to(tl.float32)
        dense = rows[:, None] * C + cols[None, :]
        dy = tl.load(grad_ptr + dense, mask=mask, other=0.).to(tl.float32)
        tl.store(out_ptr + dense, (s * g).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(grad_s_ptr + dense, (dy * g).to(grad_s_ptr.dtype.element_ty), mask=mask)
        tl.store(grad_g_ptr + dense, (dy * s).to(grad_g_ptr.dtype.element_ty), mask=mask)

_GELU_BLOCK = 1024  # elements per program: 8 per thread at 4 warps
_GATE_BLOCKS = dict(BLOCK_M=16, BLOCK_C=64, num_warps=4)  # 1024 elements per program, rows of 64 channels


def gelu_and_gelu_backward(h, grad, out_dtype):
    """(``F.gelu(h)`` in ``out_dtype``, the gradient of h for the gradient ``grad`` of that output, in h's
    dtype), by one kernel; h and grad contiguous, of one shape."""
    out = torch.empty(h.shape, dtype=out_dtype, device=h.device)
    grad_h = torch.empty_like(h, memory_format=torch.contiguous_format)
    n = h.numel()
    launch(_gelu_and_backward_kernel, (triton.cdiv(n, _GELU_BLOCK), ), h, grad, out, grad_h, n, BLOCK=_GELU_BLOCK,
           num_warps=4)
    return out, grad_h


def gate_and_gate_backward(s, g, grad, out_dtype):
    """(``s * g`` in ``out_dtype``, the gradients of s and g for the gradient ``grad`` of that product, in their
    dtypes), by one kernel; s and g (M, C) with unit column stride, grad (M, C) contiguous; outputs contiguous."""
    M, C = grad.shape
    out = torch.empty(M, C, dtype=out_dtype, device=grad.device)
    grad_s = torch.empty(M, C, dtype=s.dtype, device=grad.device)
    grad_g = torch.empty(M, C, dtype=g.dtype, device=grad.device)
    grid = (triton.cdiv(M, _GATE_BLOCKS['BLOCK_M']), triton.cdiv(C, _GATE_BLOCKS['BLOCK_C']))
    launch(_gate_and_backward_kernel, grid, s, g, grad, out, grad_s, grad_g, M, C, s.stride(0), g.stride(0),
           **_GATE_BLOCKS)
    return out, grad_s, grad_g
