"""Depthwise convolution in Triton kernels, forward and backward (``impl='triton'`` of
:func:`mmpola.ops.depthwise.depthwise_conv2d`).

``out = F.conv2d(x, w, b, padding=k // 2, groups=C)`` for x (B, C, H, W), w (C, 1, k, k), k odd, stride 1,
or with kernels of their own per image (``per_sample``: w (B, C, k, k), bias (B, C)); or for x (B, G, C, H, W),
G maps per image convolved by the same kernels, read through both strides (an attention's per-head values seen
in place in their projection: a map's offset is its image's plus its head's).
Two kernels, each program working on a tile of BLOCK_H x BLOCK_W pixels of one image and BLOCK_C
channels (the channels are the contiguous axis of a channels-last map, so each load of a tap reads
whole rows of channels):

1. ``_dw_conv_kernel``: for each of the k * k taps, the shifted tile (zeros outside the image) times
   the tap's weights, accumulated in float32 (the tile's pointers made once, each row of taps moving them
   a row and each tap a column: one offset per tap, the same for every pixel), plus the bias (and, given
   one, the tile of a residual tensor of the output's shape, the sum written in the residual's layout: an
   attention's output with the value term added where the term is written); written channels-last in x's
   dtype. The
   input gradient is the same kernel on the output gradient with the kernel flipped (``FLIP``): for an
   odd kernel with ``k // 2`` padding, the transposed convolution is the convolution by the flipped
   kernel. It is written in the input's layout when the input's channels are its contiguous axis (the
   heads' values seen in their projection: their gradient then meets the attention core's in the
   projection's layout, and their sum needs no copy on its way to the projection), or added in place to a
   gradient already there (the values' gradient from the core), the convolution's rounded first, as autograd
   adds two gradients. With a gate (Pola's, after its value term), the kernel also writes the output times the
   gate, as the library multiplies them.
2. ``_dw_weight_grad_kernel``: a fixed number of programs (a few per multiprocessor, independent of
   the map size) each loops over a share of the tiles and sums, per channel, ``g * shifted x`` for each
   tap and ``g`` for the bias, into one float32 record (taps + 1, C) per program; one torch ``.sum``
   over the programs (deterministic, no atomics) gives the weight and bias gradients. Per-image kernels
   get programs of their own per image (a third grid axis), whose records sum to each image's gradients.
   After a gate it also reads the gate and the output before it where it reads the gradient, and writes the
   gate's gradient and the gradient before the gate, which it sums.

Where a kernel writes what the library's elementwise multiplication or addition of two tensors writes, it rounds
as the library does (to the nearest, ties to even; Triton's interpreter truncates to bfloat16, so the kernels round
bfloat16 themselves), so that those results are the library's bit for bit, on a GPU and in the interpreter.

The grids and the loops take the map size as data and the kernels do not specialise on it: they are
compiled once per dtype, kernel size and channel bucket (up to 32 channels, or more), so a new input
size launches the compiled kernels as they are. On a GPU each kernel is tuned (triton_support.tunable)
over its tile, channel block and warps, keyed on the kernel size and the channel bucket; untuned, it runs
tiles of 8 x 8 pixels, and Triton's interpreter tiles of 16 x 16. Inputs of any strides (channels-last
views are read in place); float32, float16 or bfloat16, accumulated in float32 (float64 under the
interpreter, for tests, accumulated in float32 too).
"""
import torch

from .dispatch import apply_function, autocast_dtype
from .triton_support import (
    autocast_operands,
    cdiv,
    kernel_target,
    launch,
    next_power_of_2,
    require_triton,
    triton_available,
    tunable,
)

__all__ = ['depthwise_conv2d_triton']

if triton_available() is None:
    import triton
    import triton.language as tl

    # tiles of 32 or 64 pixels and 32 or 64 channels, 16 elements of a tile per thread (the taps' loads
    # in flight need registers of their own); channel blocks no wider than the channels' bucket (CB)
    _TUNED = [triton.Config({'BLOCK_H': bh, 'BLOCK_W': bw, 'BLOCK_C': bc}, num_warps=bh * bw * bc // 512)
              for bh, bw in ((8, 8), (4, 16), (4, 8)) for bc in (32, 64)]
    # the interpreter's tile where no config is forced: 16 x 16 pixels (maps up to that size in one program,
    # larger ones in several), its time going per program and per operation rather than per pixel
    _INTERPRETER_TILE = dict(BLOCK_H=16, BLOCK_W=16)

    def _fitting(configs, named_args, **kwargs):
        return [config for config in configs if config.kwargs['BLOCK_C'] <= kwargs['CB']]

    @triton.jit
    def _tile(tile, H, W, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
        """Image (int64), pixel rows and columns of the flat tile index ``tile`` (row-major tiles per image)."""
        tiles_w = tl.cdiv(W, BLOCK_W)
        tiles_hw = tl.cdiv(H, BLOCK_H) * tiles_w
        b = (tile // tiles_hw).to(tl.int64)
        t = tile % tiles_hw
        i = tl.arange(0, BLOCK_H * BLOCK_W)
        return b, (t // tiles_w) * BLOCK_H + i // BLOCK_W, (t % tiles_w) * BLOCK_W + i % BLOCK_W

    @triton.jit
    def _image(ptr, b, G, sb, sg):
        """``ptr`` moved to map ``b`` of B x G maps (G maps per image, the heads of an attention: strides sb
        per image and sg per map; G = 1 for plain images)."""
        return ptr + (b // G) * sb + (b % G) * sg

    @triton.jit
    def _row(pixels, y, dy, H, sh):
        """The pointers ``pixels`` (the tile's pixels, all channels of the block) moved dy rows, and which of
        the tile's pixels that row shift keeps inside the map."""
        yy = y + dy
        return pixels + dy * sh, (yy >= 0) & (yy < H)

    @triton.jit
    def _shifted(row, inside, x, dx, W, cm, sw):
        """The pixels of a row shift (:func:`_row`: its pointers and pixels inside) moved dx columns, in float32
        (zeros outside the map and at the channels outside ``cm``, the block's (1, BLOCK_C) channel mask)."""
        xx = x + dx
        ok = inside & (xx >= 0) & (xx < W)
        return tl.load(row + dx * sw, mask=ok[:, None] & cm, other=0.).to(tl.float32)

    @triton.jit
    def _rounded(x, dtype: tl.constexpr):
        """float32 ``x`` rounded to ``dtype`` to the nearest, ties to even, as the library rounds an elementwise
        result: a GPU's conversion does, Triton's interpreter truncates to bfloat16, so for bfloat16 the bits are
        rounded here (NaN as it is)."""
        if dtype == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits += 0x7FFF + ((bits >> 16) & 1)
            return tl.where(x == x, (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True), x.to(tl.bfloat16))
        return x.to(dtype)

    @triton.jit
    def _sum(a, b):
        """``a + b`` of two tiles of one dtype, as the library adds two tensors of it (:func:`_product`)."""
        if a.dtype == tl.float64:
            return a + b
        return _rounded(a.to(tl.float32) + b.to(tl.float32), a.dtype)

    @triton.jit
    def _product(a, b):
        """``a * b`` of two tiles of one dtype, as the library multiplies two tensors of it: the product in float32
        (float64 for float64), rounded once to their dtype."""
        if a.dtype == tl.float64:
            return a * b
        return _rounded(a.to(tl.float32) * b.to(tl.float32), a.dtype)

    @tunable(_TUNED, ['CB', 'K', 'FLIP'], _fitting, interpreter=_INTERPRETER_TILE)
    @triton.jit(do_not_specialize=['G', 'H', 'W'])
    def _dw_conv_kernel(x_ptr, w_ptr, bias_ptr, r_ptr, out_ptr, gate_ptr, gated_ptr, G, C, H, W, sxb, sxg, sxc, sxh,
                        sxw, swb, swc, swy, swx, sbb, srb, srg, src, srh, srw, sob, sog, soc, soh, sow, sgb, sgg, sgc,
                        sgh, sgw,
                        K: tl.constexpr, CB: tl.constexpr, FLIP: tl.constexpr, HAS_BIAS: tl.constexpr,
                        RESIDUAL: tl.constexpr, ROUND: tl.constexpr, GATE: tl.constexpr, BLOCK_H: tl.constexpr,
                        BLOCK_W: tl.constexpr, BLOCK_C: tl.constexpr):
        """One tile of map b's output (written through its strides, channels the contiguous axis) of the
        depthwise convolution (weights and bias of map b at ``w_ptr + b * swb``, ``bias_ptr + b * sbb``: 0 for
        those shared by the maps), plus the tile of the residual at ``r_ptr`` (``RESIDUAL``; with ``ROUND`` added
        to the convolution rounded to the output's dtype, as the library adds two tensors of it). ``GATE``: also
        the output times the gate's tile (at ``gate_ptr``, strides sg*), rounded as the library multiplies two
        tensors of the output's dtype, written at ``gated_ptr`` (the output's strides)."""
        b, y, x = _tile(tl.program_id(0), H, W, BLOCK_H, BLOCK_W)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        cmask = c < C
        cm = cmask[None, :]
        pixels = _image(x_ptr, b, G, sxb, sxg) + c[None, :] * sxc + y[:, None] * sxh + x[:, None] * sxw
        taps = w_ptr + b * swb + c * swc
        acc = tl.zeros((BLOCK_H * BLOCK_W, BLOCK_C), dtype=tl.float32)
        for ky in range(K):  # a loop over the rows of taps, unrolled along each row (registers for K loads)
            row, inside_row = _row(pixels, y, ky - K // 2, H, sxh)
            taps_row = taps + ((K - 1 - ky) if FLIP else ky) * swy
            for kx in tl.static_range(K):
                weight = tl.load(taps_row + ((K - 1 - kx) if FLIP else kx) * swx, mask=cmask, other=0.)
                acc += _shifted(row, inside_row, x, kx - K // 2, W, cm, sxw) * weight.to(tl.float32)[None, :]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + b * sbb + c, mask=cmask, other=0.).to(tl.float32)[None, :]
        inside = (y < H) & (x < W)
        offsets = y[:, None] * soh + x[:, None] * sow + c[None, :] * soc
        if RESIDUAL:
            residual = tl.load(_image(r_ptr, b, G, srb, srg) + y[:, None] * srh + x[:, None] * srw + c[None, :] * src,
                               mask=inside[:, None] & cmask[None, :], other=0.)
            if ROUND:  # the convolution in the output's dtype plus the residual, as the library adds two tensors
                result = _sum(acc.to(out_ptr.dtype.element_ty), residual)
            else:
                result = (acc + residual.to(tl.float32)).to(out_ptr.dtype.element_ty)
        else:
            result = acc.to(out_ptr.dtype.element_ty)
        tl.store(_image(out_ptr, b, G, sob, sog) + offsets, result, mask=inside[:, None] & cmask[None, :])
        if GATE:
            gate = tl.load(_image(gate_ptr, b, G, sgb, sgg) + y[:, None] * sgh + x[:, None] * sgw + c[None, :] * sgc,
                           mask=inside[:, None] & cmask[None, :], other=0.)
            tl.store(_image(gated_ptr, b, G, sob, sog) + offsets, _product(result, gate),
                     mask=inside[:, None] & cmask[None, :])

    @tunable(_TUNED, ['CB', 'K', 'PER_SAMPLE'], _fitting, interpreter=_INTERPRETER_TILE)
    @triton.jit(do_not_specialize=['B', 'G', 'H', 'W'])
    def _dw_weight_grad_kernel(x_ptr, g_ptr, part_ptr, gate_ptr, total_ptr, gated_ptr, grad_gate_ptr, B, G, C, H, W,
                               sxb, sxg, sxc, sxh, sxw, sgb, sgg, sgc, sgh, sgw, sab, sag, sac, sah, saw, stb, stg, stc,
                               sth, stw,
                               K: tl.constexpr, CB: tl.constexpr, TAPS: tl.constexpr, PER_SAMPLE: tl.constexpr,
                               GATE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr,
                               BLOCK_C: tl.constexpr):
        """This program's share of the weight gradient (taps 0 .. K*K-1) and bias gradient (row K*K),
        per channel of the block, as one float32 record (TAPS, C): over the tiles of every map (B maps, in
        groups of G), or with ``PER_SAMPLE`` over those of map ``program_id(2)`` only (weights of their own
        per map). ``GATE``: the convolution's output was multiplied by a gate (at ``gate_ptr``, strides sa*;
        the output before it at ``total_ptr``, strides st*): g is the product's gradient, and the kernel writes
        the convolution's, ``g * gate``, at ``gated_ptr`` (the output's strides) and the gate's, ``g * total``,
        at ``grad_gate_ptr`` (the gate's strides), each rounded as the library multiplies them, and sums the
        former (each pixel's tile is this kernel's once)."""
        prog = tl.program_id(0)
        programs = tl.num_programs(0)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        cmask = c < C
        cm = cmask[None, :]
        taps = tl.arange(0, TAPS)[:, None]
        acc = tl.zeros((TAPS, BLOCK_C), dtype=tl.float32)
        tiles_hw = tl.cdiv(H, BLOCK_H) * tl.cdiv(W, BLOCK_W)
        if PER_SAMPLE:
            first = tl.program_id(2) * tiles_hw
            last = first + tiles_hw
            prog += tl.program_id(2) * programs  # the record of this image's program
        else:
            first = 0
            last = B * tiles_hw
        for tile in range(first + tl.program_id(0), last, programs):
            b, y, x = _tile(tile, H, W, BLOCK_H, BLOCK_W)
            inside = (y < H) & (x < W)
            g = tl.load(_image(g_ptr, b, G, sgb, sgg) + c[None, :] * sgc + y[:, None] * sgh + x[:, None] * sgw,
                        mask=inside[:, None] & cm, other=0.)
            if GATE:
                at_gate = c[None, :] * sac + y[:, None] * sah + x[:, None] * saw
                at_total = c[None, :] * stc + y[:, None] * sth + x[:, None] * stw
                total = tl.load(_image(total_ptr, b, G, stb, stg) + at_total, mask=inside[:, None] & cm, other=0.)
                tl.store(_image(grad_gate_ptr, b, G, sab, sag) + at_gate, _product(g, total),
                         mask=inside[:, None] & cm)
                g = _product(g, tl.load(_image(gate_ptr, b, G, sab, sag) + at_gate, mask=inside[:, None] & cm,
                                        other=0.))
                tl.store(_image(gated_ptr, b, G, stb, stg) + at_total, g, mask=inside[:, None] & cm)
            g = g.to(tl.float32)
            acc += tl.where(taps == K * K, tl.sum(g, axis=0)[None, :], 0.)
            pixels = _image(x_ptr, b, G, sxb, sxg) + c[None, :] * sxc + y[:, None] * sxh + x[:, None] * sxw
            for ky in range(K):
                row, inside_row = _row(pixels, y, ky - K // 2, H, sxh)
                for kx in tl.static_range(K):
                    shifted = _shifted(row, inside_row, x, kx - K // 2, W, cm, sxw)
                    acc += tl.where(taps == ky * K + kx, tl.sum(g * shifted, axis=0)[None, :], 0.)
        tl.store(part_ptr + (prog * TAPS + taps) * C + c[None, :], acc, mask=(taps < K * K + 1) & cm)


def _channel_bucket(channels):
    """The tuning key of a channel count: 32 up to 32 channels, else 64 (the widest channel block)."""
    return 32 if channels <= 32 else 64


def _options(channels, k):
    """The kernels' compile-time arguments and default config (triton_support.launch)."""
    bucket = _channel_bucket(channels)
    return dict(K=k, CB=bucket, default=dict(BLOCK_H=8, BLOCK_W=8, BLOCK_C=bucket, num_warps=bucket // 8))


def _conv_grid(B, H, W, C):
    return lambda meta: (B * cdiv(H, meta['BLOCK_H']) * cdiv(W, meta['BLOCK_W']),
                         cdiv(C, meta['BLOCK_C']))


def _weight_strides(weight, per_sample):
    """(per image, channel, row, column) strides of the weights: (C, 1, k, k) shared by the images (0 per
    image), or (B, C, k, k) per image."""
    if per_sample:
        return weight.stride()
    return 0, weight.stride(0), weight.stride(2), weight.stride(3)


def _maps(x):
    """(maps, maps per image G, channels, H, W) and the strides (per image, per map, channel, row, column) of
    x (B, C, H, W), or of x (B, G, C, H, W): G maps per image convolved by the same kernels."""
    if x.dim() == 4:
        B, C, H, W = x.shape
        return (B, 1, C, H, W), (x.stride(0), 0, *x.stride()[1:])
    B, G, C, H, W = x.shape
    return (B * G, G, C, H, W), x.stride()


def _convolve(x, weight, bias, flip, per_sample, like=None, residual=None, into=None, gate=None):
    """The kernel's output of x's shape in x's dtype: in the layout of ``like`` (the input of a convolution whose
    input gradient this is) when its channels are the contiguous axis, so that the gradient of a view of an
    attention's projection comes in the projection's layout; else, with ``residual`` (x's shape and dtype, added),
    in its layout; else channels-last per map (the maps one after another).

    ``into``: a tensor of x's shape and dtype to add the output to in place, the output rounded to its dtype first
    (as autograd adds one gradient to another); returns it. ``gate``: a tensor of x's shape and dtype that the
    output is multiplied by as the library multiplies them; returns (the output, the product), the product in the
    output's layout."""
    (maps, G, C, H, W), strides = _maps(x)
    k = weight.shape[-1]
    if into is not None:
        out = residual = into
    elif like is not None and like.stride(-3) == 1:
        out = torch.empty_like(like, dtype=x.dtype)
    elif residual is not None:
        out = torch.empty_like(residual)
    else:
        out = torch.empty(*x.shape[:-3], H, W, C, dtype=x.dtype, device=x.device).movedim(-1, -3)
    bias = weight if bias is None else bias.contiguous()  # read as (C,) or (B, C) rows; a dummy without one
    out_strides = _maps(out)[1]
    # without a residual or a gate the kernel reads neither: the output's pointer and strides stand in for them
    added, added_strides = out, out_strides
    if residual is not None and residual is not out:
        added, added_strides = residual, _maps(residual)[1]
    gated_output = gate is not None
    if gated_output:
        gated = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=out.device)
        gate_strides = gate.stride() if gate.dim() == 5 else _maps(gate)[1]
    else:
        gate = gated = out
        gate_strides = out_strides
    launch(_dw_conv_kernel, _conv_grid(maps, H, W, C), x, weight, bias, added, out, gate, gated, G, C, H, W,
           *strides, *_weight_strides(weight, per_sample), C if per_sample else 0, *added_strides, *out_strides,
           *gate_strides, FLIP=flip, HAS_BIAS=bias is not weight, RESIDUAL=residual is not None,
           ROUND=into is not None, GATE=gated_output, **_options(C, k))
    return (out, gated) if gated_output else out


def _weight_grad_programs(B, C, H, W, device, per_sample):
    """Programs of the weight-gradient kernel per channel block (and per image with ``per_sample``): a few
    per multiprocessor in all, counting the blocks of the widest config (a few in the interpreter), at most
    one per 64 pixels; a function of the sizes only, whatever the config (the records of the partial sums
    do not depend on it)."""
    target = kernel_target(device)
    programs = cdiv(4 * target.sm_count, cdiv(C, 64)) if target.gpu else 3
    if per_sample:
        return max(1, min(cdiv(programs, B), cdiv(H * W, 64)))
    return max(1, min(programs, cdiv(B * H * W, 64)))


def _weight_grads(x, weight, g, has_bias, per_sample, needs, gate=None):
    """(the weight's and the bias's gradients, each None where ``needs`` (two bools) says it is not needed) of the
    convolution of x by ``weight`` (its bias: ``has_bias``) from the output's gradient g; the weight's gradient in
    the weight's strides.

    ``gate``: None, or ``(gate, total, grad_gate, gated)`` where the convolution's output ``total`` was multiplied
    by ``gate`` and g is the product's gradient (maps (B, G, C, H, W) of x's shape and g's dtype): the kernel also
    writes the gate's gradient ``g * total`` into ``grad_gate`` (the gate's strides) and the output's, ``g * gate``,
    into ``gated`` (total's strides), each as the library multiplies them, and the weight's gradients are those of
    the latter."""
    (B, G, C, H, W), x_strides = _maps(x)
    k = weight.shape[-1]
    grad_w = grad_b = None
    taps = next_power_of_2(k * k + 1)
    programs = _weight_grad_programs(B, C, H, W, x.device, per_sample)
    images = B if per_sample else 1
    part = torch.empty(images, programs, taps, C, dtype=torch.float32, device=x.device)
    g_strides = _maps(g)[1]
    if gate is None:
        gate = total = grad_gate = gated = g  # pointers (and strides) the kernel does not read
        gate_strides = total_strides = g_strides
    else:
        gate, total, grad_gate, gated = gate
        if grad_gate.stride() != gate.stride() or gated.stride() != total.stride():
            raise ValueError("the gated weight-gradient kernel writes the gate's gradient in the gate's strides and "
                             "the output's in total's")
        gate_strides, total_strides = gate.stride(), total.stride()
    launch(_dw_weight_grad_kernel, lambda meta: (programs, cdiv(C, meta['BLOCK_C']), images), x, g,
           part, gate, total, gated, grad_gate, B, G, C, H, W, *x_strides, *g_strides, *gate_strides,
           *total_strides, TAPS=taps, PER_SAMPLE=per_sample, GATE=gate is not g, **_options(C, k))
    summed = part[:, 0] if programs == 1 else part.sum(1)  # (images, taps, C)
    (s_image, s_tap, s_channel), offset = summed.stride(), summed.storage_offset()
    if needs[0]:
        grad_w = torch.empty_like(weight)  # the weight's strides (channels-last for mmpola's convs)
        # the taps' rows (images, C, k * k), one view operator
        taps_first = summed.as_strided((images, C, k * k), (s_image, s_channel, s_tap), offset)
        if grad_w.is_contiguous():  # as (images, C, k * k): one copy
            grad_w.view(taps_first.shape).copy_(taps_first)
        else:
            grad_w.copy_(taps_first.reshape(weight.shape))
    if has_bias and needs[1]:  # the bias's row, (images, C) or (C, )
        shape, strides = ((images, C), (s_image, s_channel)) if per_sample else ((C, ), (s_channel, ))
        grad_b = summed.as_strided(shape, strides, offset + k * k * s_tap).to(weight.dtype)
    return grad_w, grad_b


class _DepthwiseTriton(torch.autograd.Function):
    """The kernels' autograd. Where the residual is the input itself (``x + conv(x)``: a block's positional
    convolution, PolaFormer++'s FFN), the input gradient's kernel adds the output's gradient where it writes
    (``conv_T(g) + g``, one kernel), where autograd would add the gradients of the input's two uses."""

    @staticmethod
    def forward(ctx, x, weight, bias, per_sample, residual):
        ctx.save_for_backward(x, weight)
        ctx.has_bias, ctx.per_sample, ctx.identity = bias is not None, per_sample, residual is x
        return _convolve(x, weight, bias, False, per_sample, residual=residual)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad_x = grad_w = grad_b = None
        if needs[0]:  # with the input as the residual, both of its gradients in the input gradient's kernel
            grad_x = _convolve(g, weight, None, True, ctx.per_sample, like=x, residual=g if ctx.identity else None)
        if needs[1] or (ctx.has_bias and needs[2]):
            grad_w, grad_b = _weight_grads(x, weight, g, ctx.has_bias, ctx.per_sample, needs[1:3])
        return grad_x, grad_w, grad_b, None, g if needs[4] and not ctx.identity else None


def depthwise_conv2d_triton(x, weight, bias=None, per_sample=False, residual=None):
    """``F.conv2d(x, weight, bias, padding=k // 2, groups=C)`` (weight (C, 1, k, k), k odd) in Triton kernels,
    forward and backward; output channels-last in x's dtype (under autocast: the autocast dtype, as the
    convolution; but see ``residual``). ``per_sample``: weight (B, C, k, k), bias None or (B, C): each image its
    own kernels.
    Under autocast float32 weights and bias are read as they are (in float32, not rounded to the autocast dtype)
    and their gradients come in float32.
    ``residual``: a tensor of the output's shape added to it; in the output's dtype, where the kernel writes it,
    the sum in the residual's layout (its gradient is the output's, no copy), else after the kernel. x itself
    (``x + conv(x)``): the backward's input-gradient kernel adds x's two gradients too; and under autocast a
    float32 x is convolved as it is, in float32 (the sum is float32 either way): one kernel reads x and writes
    the sum, where autocast's convolution of a rounded copy of x makes the copy, the convolution and a float32
    addition, and in the backward the gradient's cast and copy, the convolution's and the sum of the two."""
    require_triton(x, 'the Triton depthwise convolution', 'MMPOLA_DEPTHWISE_CONV=torch')
    dtype = autocast_dtype(x.device.type)
    if dtype is not None:
        if not (residual is x and x.dtype == torch.float32):  # x in the autocast dtype, as the library casts it
            x = x.to(dtype)
        # float32 weights and bias as they are: the kernels read them in float32, where the library convolution's
        # autocast convolves by copies rounded to x's dtype (two casts in the forward, two in the backward)
        if weight.dtype != torch.float32 or (bias is not None and bias.dtype != torch.float32):
            weight, bias = autocast_operands(x.device.type, weight, bias)
    if not ((x.dtype == weight.dtype or dtype is not None) and (bias is None or bias.dtype == weight.dtype)):
        raise TypeError(f'depthwise_conv2d expects x, weight and bias of one dtype, got {x.dtype}, {weight.dtype}'
                        f'{", " + str(bias.dtype) if bias is not None else ""}')
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f'depthwise_conv2d_triton takes a residual of the output\'s shape {tuple(x.shape)}, got '
                         f'{tuple(residual.shape)}')
    if x.numel() == 0:
        raise ValueError(f'depthwise_conv2d_triton takes inputs with elements, got {tuple(x.shape)} '
                         '(mmpola.ops.depthwise_conv2d runs empty inputs on the library convolution)')
    if residual is not None and residual.dtype != x.dtype:
        return residual + apply_function(_DepthwiseTriton, x, weight, bias, per_sample, None)
    return apply_function(_DepthwiseTriton, x, weight, bias, per_sample, residual)
