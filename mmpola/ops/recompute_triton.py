"""The backward kernels of the linear layers whose input is recomputed (``impl='triton'`` of
:mod:`mmpola.ops.recompute`).

Each reads what the forward kept and the gradient of the linear layer's input, and writes in one pass both
that input, recomputed (for the layer's weight gradient), and the gradients of what it was made from:

* ``_gelu_kernel``: from the rows of h (M, C), ``a = GELU(x)`` for ``x = h`` or, with a bias (the linear layer's
  before the GELU, which then runs without it), ``x = h + b``; with the gradient ``dL/da`` also ``dL/dh``, as
  torch's exact GELU computes them in float32: ``cdf = (1 + erf(x / sqrt(2))) / 2``, ``a = x * cdf``,
  ``dL/dh = dL/da * (cdf + x * exp(-x^2 / 2) / sqrt(2 pi))``, and with a bias each program's sums of ``dL/dh``
  over its rows (the bias's gradient, summed over the programs after it: the library's linear layer reads
  ``dL/dh`` once more for it). The forward of the layer runs it too where there is a bias, so the backward
  recomputes the same a. In the backward with a bias a program takes a fixed share of the row blocks of one
  column block, as the LayerNorm's below.
* ``_gate_and_backward_kernel``: from s and g, ``p = s * g``, ``dL/ds = dL/dp * g`` and ``dL/dg = dL/dp * s``
  (one float32 product each, as torch's multiplication and its backward). (M, C) rows read through a row
  stride (a gate seen in its projection), written contiguous.

* ``_layer_norm_kernel``: the rows of x (M, C) normalised, ``y = (x - mean) * rstd * w + b`` with the mean and
  the biased variance of each row computed in float32 (two passes over the row in registers) and
  ``rstd = 1 / sqrt(var + eps)``, as torch's LayerNorm; with the gradient ``dL/dy`` also
  ``dL/dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` for ``g = dL/dy * w`` and ``xhat = (x - mean) * rstd``,
  and each program's sums over its rows of ``dL/dy * xhat`` and ``dL/dy`` (the gradients of w and b, summed
  over the programs after it). The forward of the layer runs it too, so the backward recomputes the same y.
  A program takes whole rows (C up to ``NORM_MAX_CHANNELS``), and in the backward a fixed share of the row
  blocks: the programs, and the order of every sum, depend on M and the GPU's multiprocessor count only.
  With ``ADD`` the rows normalised are a sum ``s = x + branch`` (the branch times a factor per sample with
  ``SCALE``, the product rounded to the branch's dtype): the forward reads x and the branch and writes s with
  y; the backward reads s, adds the gradient of s from the layers after it (``GRAD_SUM``) to ``dL/dx`` and
  writes the total (s's and the residual stream's gradient) and the branch's (rounded to its dtype, times
  the factor). ``GRAD_SUM`` without ``ADD``: x itself goes on to the layers after (the residual stream), and
  its gradient from them is added to the LayerNorm's the same way.

* ``_operand_grads_kernel``: the gradient of a linear layer's output (M, P * C) taken apart into P operands of C
  channels (the attention's q, k, v, g), written from the operands' gradients, read through their row strides,
  with a second gradient of one operand (used twice) added to its first, and each program's sums of the columns
  over its rows (the bias's gradient, summed over the programs after it). The operands are a compile-time loop:
  each program reads the same rows of every one.

* ``_residual_cast_kernel``: a residual connection ``s = x + branch`` of tokens (B, N, C) (the branch times a
  factor per sample, the product rounded to the branch's dtype) written with its copy in another dtype (the
  one the next layer reads), s in the tokens' layout or in its map's (``SUM_MAP``: (B, C, N)); in the backward
  the gradients of s (in either layout) and of the copy added (s's, and x's), and the branch's (rounded to
  its dtype, times the factor). Element-wise, in tiles of tokens and channels.

Every result is rounded once to its tensor's dtype. Any number of elements; float64 inputs (the
interpreter, for tests) are computed in float32 too. One compiled kernel per dtype (and the gate's and the
LayerNorm's per channel count, the GELU's with and without a bias, the LayerNorm's with and without the
addition): the token count is data, not a specialisation.
"""
import torch

from .triton_support import _DRY_RUNS, cdiv, kernel_target, launch, next_power_of_2, triton_available

__all__ = ['NORM_MAX_CHANNELS', 'OPERANDS_MAX', 'add_layer_norm_rows', 'gate_and_gate_backward', 'gelu_rows',
           'layer_norm_rows', 'norm_add_rows', 'operand_grads', 'residual_cast', 'residual_cast_backward']

if triton_available() is None:
    import triton
    import triton.language as tl

    @triton.jit(do_not_specialize=['M', 'blocks_per_program'])  # the token count: data
    def _gelu_kernel(h_ptr, b_ptr, grad_ptr, out_ptr, grad_h_ptr, parts_ptr, M, C, blocks_per_program,
                     BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BIAS: tl.constexpr, GRAD: tl.constexpr):
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        col_mask = cols < C
        if BIAS:
            b = tl.load(b_ptr + cols, mask=col_mask, other=0.).to(tl.float32)
        sum_b = tl.zeros((BLOCK_C, ), dtype=tl.float32)
        for i in range(0, blocks_per_program):
            rows = ((tl.program_id(0) * blocks_per_program + i) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
            mask = (rows[:, None] < M) & col_mask[None, :]
            offsets = rows[:, None] * C + cols[None, :]
            x = tl.load(h_ptr + offsets, mask=mask, other=0.).to(tl.float32)
            if BIAS:
                x += b[None, :]
            cdf = 0.5 * (1. + tl.math.erf(x * 0.7071067811865476))  # 1 / sqrt(2)
            tl.store(out_ptr + offsets, (x * cdf).to(out_ptr.dtype.element_ty), mask=mask)
            if GRAD:
                dy = tl.load(grad_ptr + offsets, mask=mask, other=0.).to(tl.float32)
                pdf = tl.exp(-0.5 * x * x) * 0.3989422804014327  # 1 / sqrt(2 pi)
                dx = dy * (cdf + x * pdf)
                tl.store(grad_h_ptr + offsets, dx.to(grad_h_ptr.dtype.element_ty), mask=mask)
                if BIAS:
                    sum_b += tl.sum(tl.where(mask, dx, 0.), axis=0)
        if GRAD and BIAS:
            tl.store(parts_ptr + tl.program_id(0) * C + cols, sum_b, mask=col_mask)

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

    @triton.jit
    def _round(x, dtype: tl.constexpr):
        """float32 ``x`` rounded to ``dtype`` (to nearest even, as torch) and back; float32 and wider unchanged.
        bfloat16 by the bits (Triton's interpreter truncates in its conversion), NaN kept."""
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
            x = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
        elif dtype == tl.float16:
            x = x.to(tl.float16).to(tl.float32)
        return x

    @triton.jit
    def _normalise(x, mask, C, eps):
        """(x_hat, rstd) of float32 rows x (BLOCK_M, BLOCK_C), their ``mask``ed entries zero: the LayerNorm's
        normalised rows (zero where masked) and each row's reciprocal standard deviation."""
        mean = tl.sum(x, axis=1) / C
        centred = tl.where(mask, x - mean[:, None], 0.)
        rstd = 1. / tl.sqrt(tl.sum(centred * centred, axis=1) / C + eps)
        return centred * rstd[:, None], rstd

    @triton.jit
    def _normalise_backward(dy, w, x_hat, rstd, C):
        """The gradient of the LayerNorm's input rows from that of its output ``dy`` (float32 rows)."""
        g = dy * w[None, :]
        mean_g = tl.sum(g, axis=1) / C
        mean_gx = tl.sum(g * x_hat, axis=1) / C
        return (g - mean_g[:, None] - x_hat * mean_gx[:, None]) * rstd[:, None]

    @triton.jit(do_not_specialize=['M', 'blocks_per_program', 'tokens'])  # the token count: data
    def _layer_norm_kernel(x_ptr, w_ptr, b_ptr, grad_ptr, y_ptr, grad_x_ptr, parts_ptr, branch_ptr, scale_ptr,
                           sum_ptr, grad_sum_ptr, grad_branch_ptr, M, C, tokens, eps, blocks_per_program,
                           BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, GRAD: tl.constexpr, ADD: tl.constexpr,
                           SCALE: tl.constexpr, GRAD_SUM: tl.constexpr):
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK_C)
        col_mask = cols < C
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=col_mask, other=0.).to(tl.float32)
        sum_w = tl.zeros((BLOCK_C, ), dtype=tl.float32)
        sum_b = tl.zeros((BLOCK_C, ), dtype=tl.float32)
        for i in range(0, blocks_per_program):
            rows = ((pid * blocks_per_program + i) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
            mask = (rows[:, None] < M) & col_mask[None, :]
            offsets = rows[:, None] * C + cols[None, :]
            x = tl.load(x_ptr + offsets, mask=mask, other=0.).to(tl.float32)
            if ADD:  # the branch's per-sample factor (stochastic depth)
                if SCALE:
                    factor = tl.load(scale_ptr + rows // tokens, mask=rows < M, other=0.).to(tl.float32)
            if ADD and not GRAD:  # the forward: x is the residual stream, the sum is written and normalised
                branch = tl.load(branch_ptr + offsets, mask=mask, other=0.).to(tl.float32)
                if SCALE:
                    branch = _round(branch * factor[:, None], branch_ptr.dtype.element_ty)
                x = _round(x + branch, sum_ptr.dtype.element_ty)
                tl.store(sum_ptr + offsets, x.to(sum_ptr.dtype.element_ty), mask=mask)
            x_hat, rstd = _normalise(x, mask, C, eps)
            tl.store(y_ptr + offsets, (x_hat * w[None, :] + b[None, :]).to(y_ptr.dtype.element_ty), mask=mask)
            if GRAD:
                dy = tl.load(grad_ptr + offsets, mask=mask, other=0.).to(tl.float32)
                dx = _normalise_backward(dy, w, x_hat, rstd, C)
                if GRAD_SUM:  # x's gradient from the layers after the function too (x is returned: the sum)
                    dx += tl.load(grad_sum_ptr + offsets, mask=mask, other=0.).to(tl.float32)
                if ADD:  # the backward of the sum: the branch's gradient
                    d_branch = _round(dx, grad_branch_ptr.dtype.element_ty)
                    if SCALE:
                        d_branch = _round(d_branch * factor[:, None], grad_branch_ptr.dtype.element_ty)
                    tl.store(grad_branch_ptr + offsets, d_branch.to(grad_branch_ptr.dtype.element_ty), mask=mask)
                tl.store(grad_x_ptr + offsets, dx.to(grad_x_ptr.dtype.element_ty), mask=mask)
                sum_w += tl.sum(dy * x_hat, axis=0)
                sum_b += tl.sum(dy, axis=0)
        if GRAD:
            tl.store(parts_ptr + pid * 2 * C + cols, sum_w, mask=col_mask)
            tl.store(parts_ptr + pid * 2 * C + C + cols, sum_b, mask=col_mask)

    @triton.jit(do_not_specialize=['M', 'blocks_per_program', 'tokens'])  # the token count: data
    def _norm_add_kernel(x_ptr, w_ptr, b_ptr, addend_ptr, grad_ptr, y_ptr, grad_x_ptr, parts_ptr, M, C, tokens,
                         x_sample, x_token, x_channel, eps, blocks_per_program, BLOCK_M: tl.constexpr,
                         BLOCK_C: tl.constexpr, GRAD: tl.constexpr):
        # rows = samples x tokens; x (and its gradient) in x's layout, the output and its gradient contiguous
        pid = tl.program_id(0)
        cols = tl.arange(0, BLOCK_C)
        col_mask = cols < C
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.).to(tl.float32)
        sum_w = tl.zeros((BLOCK_C, ), dtype=tl.float32)
        sum_b = tl.zeros((BLOCK_C, ), dtype=tl.float32)
        if not GRAD:
            b = tl.load(b_ptr + cols, mask=col_mask, other=0.).to(tl.float32)
        for i in range(0, blocks_per_program):
            rows = ((pid * blocks_per_program + i) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
            mask = (rows[:, None] < M) & col_mask[None, :]
            token = rows % tokens
            x_offsets = (rows // tokens)[:, None] * x_sample + token[:, None] * x_token + cols[None, :] * x_channel
            offsets = rows[:, None] * C + cols[None, :]
            x = tl.load(x_ptr + x_offsets, mask=mask, other=0.).to(tl.float32)
            x_hat, rstd = _normalise(x, mask, C, eps)
            if GRAD:
                dy = tl.load(grad_ptr + offsets, mask=mask, other=0.).to(tl.float32)
                dx = _normalise_backward(dy, w, x_hat, rstd, C)
                tl.store(grad_x_ptr + x_offsets, dx.to(grad_x_ptr.dtype.element_ty), mask=mask)
                sum_w += tl.sum(dy * x_hat, axis=0)
                sum_b += tl.sum(dy, axis=0)
            else:
                y = x_hat * w[None, :] + b[None, :]
                y += tl.load(addend_ptr + token[:, None] * C + cols[None, :], mask=mask, other=0.).to(tl.float32)
                tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
        if GRAD:
            tl.store(parts_ptr + pid * 2 * C + cols, sum_w, mask=col_mask)
            tl.store(parts_ptr + pid * 2 * C + C + cols, sum_b, mask=col_mask)

    @triton.jit(do_not_specialize=['M', 'blocks_per_program'])  # the token count: data
    def _operand_grads_kernel(g0_ptr, g1_ptr, g2_ptr, g3_ptr, extra_ptr, out_ptr, parts_ptr, M, C, stride0, stride1,
                              stride2, stride3, extra_stride, blocks_per_program, OPERANDS: tl.constexpr,
                              EXTRA: tl.constexpr, BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        col_mask = cols < C
        for p in tl.static_range(OPERANDS):  # the operand's gradient (and the extra one's), chosen when compiled
            if p == 0:
                src, stride = g0_ptr, stride0
            elif p == 1:
                src, stride = g1_ptr, stride1
            elif p == 2:
                src, stride = g2_ptr, stride2
            else:
                src, stride = g3_ptr, stride3
            sums = tl.zeros((BLOCK_C, ), dtype=tl.float32)
            for i in range(0, blocks_per_program):
                rows = ((tl.program_id(0) * blocks_per_program + i) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
                mask = (rows[:, None] < M) & col_mask[None, :]
                grad = tl.load(src + rows[:, None] * stride + cols[None, :], mask=mask, other=0.).to(tl.float32)
                if p == EXTRA:  # the operand's second use: the two gradients added, rounded once
                    grad += tl.load(extra_ptr + rows[:, None] * extra_stride + cols[None, :], mask=mask,
                                    other=0.).to(tl.float32)
                    grad = _round(grad, out_ptr.dtype.element_ty)
                tl.store(out_ptr + rows[:, None] * (OPERANDS * C) + p * C + cols[None, :],
                         grad.to(out_ptr.dtype.element_ty), mask=mask)
                if BIAS:
                    sums += tl.sum(grad, axis=0)
            if BIAS:
                tl.store(parts_ptr + tl.program_id(0) * OPERANDS * C + p * C + cols, sums, mask=col_mask)

    @triton.jit(do_not_specialize=['N'])  # the token count: data
    def _residual_cast_kernel(x_ptr, branch_ptr, scale_ptr, sum_ptr, copy_ptr, grad_sum_ptr, grad_copy_ptr, grad_x_ptr,
                              grad_branch_ptr, N, C, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, GRAD: tl.constexpr,
                              SCALE: tl.constexpr, GRAD_SUM: tl.constexpr, GRAD_COPY: tl.constexpr,
                              GRAD_X: tl.constexpr, SUM_MAP: tl.constexpr):
        sample = tl.program_id(2).to(tl.int64)
        tokens = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        mask = (tokens[:, None] < N) & (cols[None, :] < C)
        offsets = sample * N * C + tokens[:, None].to(tl.int64) * C + cols[None, :]  # (B, N, C) rows
        if SUM_MAP:  # the sum (and its gradient) in the layout of its (B, C, H, W) map
            sum_offsets = sample * N * C + cols[None, :].to(tl.int64) * N + tokens[:, None]
        else:
            sum_offsets = offsets
        if SCALE:  # the branch's factor (stochastic depth), one per sample
            factor = tl.load(scale_ptr + sample).to(tl.float32)
        if not GRAD:  # the sum, and its copy in the copy's dtype
            x = tl.load(x_ptr + offsets, mask=mask, other=0.).to(tl.float32)
            branch = tl.load(branch_ptr + offsets, mask=mask, other=0.).to(tl.float32)
            if SCALE:
                branch = _round(branch * factor, branch_ptr.dtype.element_ty)
            s = _round(x + branch, sum_ptr.dtype.element_ty)
            tl.store(sum_ptr + sum_offsets, s.to(sum_ptr.dtype.element_ty), mask=mask)
            tl.store(copy_ptr + offsets, _round(s, copy_ptr.dtype.element_ty).to(copy_ptr.dtype.element_ty),
                     mask=mask)
        else:  # the gradients of the sum and of its copy added: the sum's whole gradient, then x's and the branch's
            g = tl.zeros((BLOCK_N, BLOCK_C), dtype=tl.float32)
            if GRAD_SUM:
                g += tl.load(grad_sum_ptr + sum_offsets, mask=mask, other=0.).to(tl.float32)
            if GRAD_COPY:
                g += tl.load(grad_copy_ptr + offsets, mask=mask, other=0.).to(tl.float32)
            g = _round(g, sum_ptr.dtype.element_ty)
            if GRAD_X:
                tl.store(grad_x_ptr + offsets, _round(g, grad_x_ptr.dtype.element_ty).to(grad_x_ptr.dtype.element_ty),
                         mask=mask)
            d_branch = _round(g, grad_branch_ptr.dtype.element_ty)
            if SCALE:
                d_branch = _round(d_branch * factor, grad_branch_ptr.dtype.element_ty)
            tl.store(grad_branch_ptr + offsets, d_branch.to(grad_branch_ptr.dtype.element_ty), mask=mask)

_BLOCK_ELEMENTS = 1024  # elements per row block of the GELU's and the operands' kernels: 8 per thread at 4 warps
_SUMMING_PROGRAMS_PER_SM = 4  # their programs per multiprocessor where they sum columns, the column blocks together
_GATE_BLOCKS = dict(BLOCK_M=16, BLOCK_C=64, num_warps=4)  # 1024 elements per program, rows of 64 channels
# Triton's interpreter runs row blocks of this many times the rows: its time goes per program and per operation,
# not per element. Where the tensors are on the CPU outside a dry run (whose launches are a GPU's) the kernels can
# only run there; the test reads an attribute and a list, no Python call, so that a GPU's and a dry run's launch
# code stay as they are.
_INTERPRETER_ROWS = 16


def _column_blocks(M, C, device, summing):
    """(compile-time options, grid, row blocks per program) of a kernel over rows (M, C) in blocks of
    ``_BLOCK_ELEMENTS`` (up to 64 columns a block; ``_INTERPRETER_ROWS`` times the rows in Triton's interpreter);
    ``summing`` (a program sums its columns over its rows): a fixed number of programs per column block, each
    taking a share of the row blocks, else one row block each."""
    block_c = min(64, max(16, next_power_of_2(C)))
    rows = _BLOCK_ELEMENTS // block_c * (1 if device.type == 'cuda' or _DRY_RUNS else _INTERPRETER_ROWS)
    options = dict(BLOCK_M=rows, BLOCK_C=block_c, num_warps=4)
    blocks, columns = cdiv(M, options['BLOCK_M']), cdiv(C, block_c)
    per_program = 1
    if summing:
        want = cdiv(_SUMMING_PROGRAMS_PER_SM * kernel_target(device).sm_count, columns)
        per_program = max(1, cdiv(blocks, want))
    return options, (max(cdiv(blocks, per_program), 1), columns), per_program


def gelu_rows(h, bias, out_dtype, grad=None):
    """``F.gelu(h + bias)`` (``F.gelu(h)`` for ``bias`` None) in ``out_dtype``, the rows of h (M, C) contiguous,
    ``bias`` (C, ) of any float dtype; with ``grad`` (the gradient of that output, (M, C) contiguous) also h's
    gradient (in h's dtype) and the bias's (in its dtype, from each program's partial sums over its rows: one
    sum after the kernel). Returns (out, grad_h, grad_bias), the gradients None without ``grad`` (and
    grad_bias without a bias). One kernel."""
    M, C = h.shape
    out = torch.empty(M, C, dtype=out_dtype, device=h.device)
    has_bias = bias is not None
    bias = h if bias is None else bias  # a pointer the kernel does not read without one
    if grad is None:
        options, grid, _ = _column_blocks(M, C, h.device, False)
        launch(_gelu_kernel, grid, h, bias, h, out, out, out, M, C, 1, BIAS=has_bias, GRAD=False, **options)
        return out, None, None
    grad_h = torch.empty(M, C, dtype=h.dtype, device=h.device)
    # with a bias, a fixed number of programs per column block, each summing the bias's gradient over its rows
    options, grid, per_program = _column_blocks(M, C, h.device, has_bias)
    parts = torch.empty(grid[0], C, dtype=torch.float32, device=h.device) if has_bias else out
    launch(_gelu_kernel, grid, h, bias, grad, out, grad_h, parts, M, C, per_program, BIAS=has_bias, GRAD=True,
           **options)
    return out, grad_h, parts.sum(0).to(bias.dtype) if has_bias else None


def gate_and_gate_backward(s, g, grad, out_dtype):
    """(``s * g`` in ``out_dtype``, the gradients of s and g for the gradient ``grad`` of that product, in their
    dtypes), by one kernel; s and g (M, C) with unit column stride, grad (M, C) contiguous; outputs contiguous."""
    M, C = grad.shape
    out = torch.empty(M, C, dtype=out_dtype, device=grad.device)
    grad_s = torch.empty(M, C, dtype=s.dtype, device=grad.device)
    grad_g = torch.empty(M, C, dtype=g.dtype, device=grad.device)
    grid = (cdiv(M, _GATE_BLOCKS['BLOCK_M']), cdiv(C, _GATE_BLOCKS['BLOCK_C']))
    launch(_gate_and_backward_kernel, grid, s, g, grad, out, grad_s, grad_g, M, C, s.stride(0), g.stride(0),
           **_GATE_BLOCKS)
    return out, grad_s, grad_g


OPERANDS_MAX = 4  # the operands whose gradients one kernel takes (and one of them used twice)


def operand_grads(grads, extra=None, extra_index=None, bias_dtype=None):
    """The gradient (M, P * C) of an output (M, P * C) taken apart into P operands of C channels (``grads``: their
    gradients (M, C), each with unit column stride, in the output's dtype; P up to ``OPERANDS_MAX``), with
    ``extra`` (M, C), a second gradient of operand ``extra_index`` (one used twice), added to its first; with
    ``bias_dtype``, also the sums of its columns in that dtype (the gradient of the bias of the linear layer that
    made the output), from each program's partial sums over its rows. Returns (grad, grad_bias or None). One
    kernel (and one sum of the partial sums), where the library stacks the gradients, adds the extra one first
    and reads the stacked gradient once more for the bias."""
    count = len(grads)
    if not 1 <= count <= OPERANDS_MAX or (extra is None) != (extra_index is None):
        raise ValueError(f'operand_grads takes 1 to {OPERANDS_MAX} gradients and an extra one with its index')
    M, C = grads[0].shape
    dtype = grads[0].dtype
    if any(g.shape != (M, C) or g.dtype != dtype or g.stride(-1) != 1 for g in (*grads, *(
            () if extra is None else (extra, )))):
        raise ValueError('operand_grads expects gradients (M, C) of one dtype with unit column stride')
    options, grid, per_program = _column_blocks(M, C, grads[0].device, bias_dtype is not None)
    out = torch.empty(M, count * C, dtype=dtype, device=grads[0].device)
    parts = torch.empty(grid[0], count * C, dtype=torch.float32, device=out.device) if bias_dtype else out
    padded = list(grads) + [grads[0]] * (OPERANDS_MAX - count)  # pointers the kernel does not read
    extra_arg = grads[0] if extra is None else extra
    launch(_operand_grads_kernel, grid, *padded, extra_arg, out, parts, M, C,
           *(g.stride(0) for g in padded), extra_arg.stride(0), per_program, OPERANDS=count,
           EXTRA=-1 if extra is None else extra_index, BIAS=bias_dtype is not None, **options)
    return out, None if bias_dtype is None else parts.sum(0).to(bias_dtype)


NORM_MAX_CHANNELS = 8192  # the widest rows the LayerNorm kernel takes (one row block holds whole rows)
_NORM_ELEMENTS = 2048  # elements per row block: rows of up to 2048 channels several to a block, wider ones alone
_NORM_PROGRAMS_PER_SM = 4  # programs of the backward per multiprocessor, each summing w's and b's gradients over
# its share of the row blocks


def _norm_options(C, backward, device):
    """The LayerNorm kernel's compile-time blocks and warps for rows of C channels on ``device``'s tensors (in
    Triton's interpreter ``_INTERPRETER_ROWS`` times the rows a block)."""
    if C > NORM_MAX_CHANNELS:
        raise ValueError(f'the LayerNorm kernel takes rows of up to {NORM_MAX_CHANNELS} channels, got {C}')
    block_c = max(16, next_power_of_2(C))
    # 8 warps for the backward's tensors (4 spill on some GPUs) and for wider rows than a block's elements
    warps = 8 if backward or block_c > _NORM_ELEMENTS else 4
    rows = max(1, _NORM_ELEMENTS // block_c) * (1 if device.type == 'cuda' or _DRY_RUNS else _INTERPRETER_ROWS)
    return dict(BLOCK_M=rows, BLOCK_C=block_c, num_warps=warps)


def _norm_backward_programs(blocks, C, device):
    """(programs, row blocks per program, their partial sums (programs, 2, C) float32) of a LayerNorm kernel's
    backward over ``blocks`` row blocks: a fixed number of programs per multiprocessor, each summing the weight's and
    the bias's gradients over its share."""
    per_program = cdiv(blocks, _NORM_PROGRAMS_PER_SM * kernel_target(device).sm_count)
    programs = max(cdiv(blocks, per_program), 1) if blocks else 1
    return programs, max(per_program, 1), torch.empty(programs, 2, C, dtype=torch.float32, device=device)


def layer_norm_rows(x, weight, bias, eps, out_dtype, grad=None, residual=None):
    """The LayerNorm of the rows of x (M, C), contiguous, with ``weight`` and ``bias`` (C, ): y in ``out_dtype``;
    with ``grad`` (dL/dy, (M, C) contiguous) also the gradients of x (in x's dtype), weight and bias (in theirs).
    Returns (y, grad_x, grad_weight, grad_bias), the gradients None without ``grad``. One kernel (and one sum of
    the programs' partial sums of the two parameter gradients).

    ``residual`` (with ``grad``): the backward of :func:`add_layer_norm_rows`, x the sum it wrote, as
    ``(grad_sum, branch_dtype, scale, tokens)``: grad_x is then the sum's whole gradient (the LayerNorm's plus
    ``grad_sum``, the gradient of the sum from the layers after it, (M, C) contiguous, or None), which is also
    the residual stream's, and a fifth result is the branch's: grad_x rounded to ``branch_dtype`` (the
    addition's backward) and, with ``scale``, times the row's factor, rounded again (the multiplication's).
    ``branch_dtype`` None: no branch (x itself went on to the layers after the LayerNorm): grad_x is the
    LayerNorm's plus ``grad_sum``, and there is no fifth result."""
    M, C = x.shape
    options = _norm_options(C, grad is not None, x.device)
    y = torch.empty(M, C, dtype=out_dtype, device=x.device)
    blocks = cdiv(M, options['BLOCK_M'])
    if grad is None:
        launch(_layer_norm_kernel, (max(blocks, 1), ), x, weight, bias, x, y, y, y, y, y, y, y, y, M, C, 1, eps, 1,
               GRAD=False, ADD=False, SCALE=False, GRAD_SUM=False, **options)
        return y, None, None, None
    programs, per_program, parts = _norm_backward_programs(blocks, C, x.device)
    grad_x = torch.empty(M, C, dtype=x.dtype, device=x.device)
    grad_sum, branch_dtype, scale, tokens = residual if residual is not None else (None, None, None, 1)
    add = branch_dtype is not None
    grad_branch = torch.empty(M, C, dtype=branch_dtype, device=x.device) if add else y
    launch(_layer_norm_kernel, (programs, ), x, weight, bias, grad, y, grad_x, parts, y,
           y if scale is None else scale, y, grad_x if grad_sum is None else grad_sum, grad_branch, M, C, tokens, eps,
           per_program, GRAD=True, ADD=add, SCALE=scale is not None, GRAD_SUM=grad_sum is not None,
           **options)
    grad_weight, grad_bias = parts.sum(0).to(weight.dtype).unbind(0)
    if not add:
        return y, grad_x, grad_weight, grad_bias
    return y, grad_x, grad_weight, grad_bias, grad_branch


def add_layer_norm_rows(x, branch, scale, tokens, weight, bias, eps, out_dtype):
    """(s, y) for the rows of x and ``branch`` (M, C), contiguous: the sum ``s = x + branch``, or with ``scale``
    (one factor per ``tokens`` rows: a sample's) ``x + branch * scale[row // tokens]`` with the product rounded
    to the branch's dtype first, in the dtype torch's addition gives (as ``x + branch * scale`` in torch), and
    the LayerNorm of s (``weight``, ``bias`` (C, )) in ``out_dtype``. One kernel; its backward is
    :func:`layer_norm_rows` with ``residual``."""
    M, C = x.shape
    options = _norm_options(C, False, x.device)
    s = torch.empty(M, C, dtype=torch.result_type(x, branch), device=x.device)
    y = torch.empty(M, C, dtype=out_dtype, device=x.device)
    blocks = cdiv(M, options['BLOCK_M'])
    launch(_layer_norm_kernel, (max(blocks, 1), ), x, weight, bias, x, y, y, y, branch,
           branch if scale is None else scale, s, y, y, M, C, tokens, eps, 1, GRAD=False, ADD=True,
           SCALE=scale is not None, GRAD_SUM=False, **options)
    return s, y


def norm_add_rows(x, weight, bias, eps, addend, out_dtype, grad=None):
    """The LayerNorm of tokens x (B, N, C), of any strides (a convolution's output map seen as tokens), with
    ``weight`` and ``bias`` (C, ), plus ``addend`` (N, C) contiguous, the same for every sample: y (B, N, C)
    contiguous in ``out_dtype``, normalised in float32 and rounded once. With ``grad`` (dL/dy, (B, N, C)
    contiguous) the backward instead: (None, grad_x in x's dtype and layout, grad_weight, grad_bias in theirs),
    the addend's gradient (the sum of ``grad`` over the samples) left to the caller. One kernel (and, in the
    backward, one sum of the programs' partial sums of the two parameter gradients)."""
    B, N, C = x.shape
    M = B * N
    options = _norm_options(C, grad is not None, x.device)
    blocks = cdiv(M, options['BLOCK_M'])
    strides = x.stride()
    if grad is None:
        y = torch.empty(B, N, C, dtype=out_dtype, device=x.device)
        launch(_norm_add_kernel, (max(blocks, 1), ), x, weight, bias, addend, y, y, y, y, M, C, max(N, 1), *strides,
               eps, 1, GRAD=False, **options)
        return y, None, None, None
    programs, per_program, parts = _norm_backward_programs(blocks, C, x.device)
    grad_x = torch.empty_strided(x.shape, strides, dtype=x.dtype, device=x.device)
    launch(_norm_add_kernel, (programs, ), x, weight, bias, grad, grad, grad, grad_x, parts, M, C, max(N, 1),
           *strides, eps, per_program, GRAD=True, **options)
    grad_weight, grad_bias = parts.sum(0).to(weight.dtype).unbind(0)
    return None, grad_x, grad_weight, grad_bias


# tokens x channels per program of the residual connection's kernel: 128 bytes of float32 along either axis
_RESIDUAL_BLOCKS = dict(BLOCK_N=64, BLOCK_C=32, num_warps=4)


def _residual_grid(B, N, C):
    return (max(cdiv(N, _RESIDUAL_BLOCKS['BLOCK_N']), 1), max(cdiv(C, _RESIDUAL_BLOCKS['BLOCK_C']), 1),
            max(B, 1))


def _is_map_view(t):
    """Whether tokens t (B, N, C) are the channels-strided view of a contiguous (B, C, N) tensor (a map's)."""
    return t.transpose(1, 2).is_contiguous() and t.stride(1) == 1


def residual_cast(x, branch, scale, dtype, sum_map=False):
    """The residual connection ``s = x + branch`` of tokens (B, N, C) (with ``scale``, one factor per sample,
    ``x + branch * scale[sample]``, the product rounded to the branch's dtype first) in the dtype torch's addition
    gives, and its copy in ``dtype``: x and branch contiguous. Returns (s, copy), the copy contiguous, s too or,
    with ``sum_map``, written in the layout of its (B, C, H, W) map: s is then that map's (B, N, C) view (a
    channels-strided one). One kernel; its backward is :func:`residual_cast_backward`."""
    B, N, C = x.shape
    if sum_map:
        s = torch.empty(B, C, N, dtype=torch.result_type(x, branch), device=x.device).transpose(1, 2)
    else:
        s = torch.empty_like(x, dtype=torch.result_type(x, branch))
    copy = torch.empty_like(x, dtype=dtype)
    launch(_residual_cast_kernel, _residual_grid(B, N, C), x, branch, x if scale is None else scale, s, copy, s, s, s,
           s, N, C, GRAD=False, SCALE=scale is not None, GRAD_SUM=False, GRAD_COPY=False, GRAD_X=False,
           SUM_MAP=sum_map, **_RESIDUAL_BLOCKS)
    return s, copy


def residual_cast_backward(grad_s, grad_copy, scale, x_dtype, branch_dtype, needs_x_grad=True):
    """The backward of :func:`residual_cast` for the gradients of s and of the copy (tokens (B, N, C); either
    None; grad_s contiguous or a map's channels-strided view, read as it is, other layouts copied first):
    (grad_x, grad_branch), their sum (s's whole gradient, the copy's cast to s's dtype first) in ``x_dtype``
    (None unless ``needs_x_grad``; grad_s itself where it is the whole gradient), and the branch's in
    ``branch_dtype`` (the sum's rounded to it, times the factor, rounded again, as torch's addition and
    multiplication give it), both contiguous. One kernel, which reads the gradients and the factors only."""
    if grad_copy is not None:
        grad_copy = grad_copy.contiguous()
    sum_map = grad_s is not None and _is_map_view(grad_s)
    if grad_s is not None and not sum_map:
        grad_s = grad_s.contiguous()
    present = grad_copy if grad_s is None else grad_s
    B, N, C = present.shape
    # x's gradient is grad_s itself where that is the whole gradient, in x's dtype
    write_x = needs_x_grad and not (grad_copy is None and grad_s.dtype == x_dtype)
    grad_x = torch.empty(B, N, C, dtype=x_dtype, device=present.device) if write_x else None
    grad_branch = torch.empty(B, N, C, dtype=branch_dtype, device=present.device)
    # a tensor of the sum's dtype, which the sum's gradient is rounded to (grad_s has it), and pointers of the
    # forward's tensors: the kernel reads neither
    sum_like = grad_s if grad_s is not None else present.new_empty(1, dtype=torch.promote_types(x_dtype,
                                                                                                 branch_dtype))
    launch(_residual_cast_kernel, _residual_grid(B, N, C), grad_branch, grad_branch,
           grad_branch if scale is None else scale, sum_like, grad_branch, present,
           present if grad_copy is None else grad_copy, grad_branch if grad_x is None else grad_x, grad_branch, N, C,
           GRAD=True, SCALE=scale is not None, GRAD_SUM=grad_s is not None, GRAD_COPY=grad_copy is not None,
           GRAD_X=write_x, SUM_MAP=sum_map, **_RESIDUAL_BLOCKS)
    if needs_x_grad and not write_x:
        grad_x = grad_s
    return grad_x, grad_branch
