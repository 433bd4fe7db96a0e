"""``python tools/benchmark.py ops --roofline GPU``: a lower bound of the device time of the counted passes
(this module holds it; run it through tools/benchmark.py).

Each kernel that a pass launches is bounded below by the larger of its arithmetic time (its floating-point
operations at the GPU's peak rate) and its memory time (the bytes of its tensors at the GPU's memory
bandwidth): the roofline model. The bound of a pass is the sum over its kernels. No kernel reaches it, and
every launch costs some microseconds more, so the bound says how much device work the pass is made of, and
ratios of bounds say how far apart two models can be when both run as well as the hardware allows. It is
an estimate made without a GPU, not a measurement.

* operators (aten, counted at the dispatcher): floating-point operations by torch's own counter
  (``torch.utils.flop_counter``: matrix products, convolutions, fused attention), with the CPU's fused
  attention counted by the formulas of CUDA's and a grouped convolution's backward as its forward once per
  gradient; other operators count their bytes only. Bytes: the distinct elements of every tensor argument
  and result (an expanded dimension counts once), so an operator in place counts its operand twice (read
  and written).
* Triton kernels (recorded by the dry run, ``mmpola.ops.triton_support.dry_run``): the bytes of their
  distinct tensor arguments, each read or written once; their arithmetic is not counted. For the Pola
  kernels that is their bound: their (d, d) products run on the tensor cores (TF32) at about d FLOPs per
  byte they read, under the GPU's ratio of tensor-core rate to bandwidth. The FLatten kernels' products
  are IEEE float32 (no tensor cores), so their bound may be their arithmetic, which is not counted here.
* rates: a product with half-precision inputs runs at the dense tensor-core rate, one in float32 at the
  float32 rate (TF32 off, as the benchmarks run).
* sources (``--by-source``): each operator's kind also names where it comes from: in the forward the line of the
  models' code that dispatched it (the innermost frame of mmpola, timm, mmdet or mmcv), in the backward the
  autograd node that ran it (the node of the forward operator whose gradient it computes, e.g. ``UnbindBackward0``
  for the views of a projection taken apart) and, where autograd's anomaly mode recorded the forward's stack
  (``ops`` records it with ``--by-source``), the line of the models' code that made that node, e.g.
  ``UnbindBackward0 pacs.py:108``. Triton kernels are named by their kernel.

The peak rates are NVIDIA's datasheet figures (dense, without sparsity) of the SXM parts.
"""
import collections
import os.path as osp
import sys
from typing import NamedTuple

import torch


class GpuPeaks(NamedTuple):
    name: str
    half_flops: float  # dense tensor-core FP16 / BF16, FLOP/s
    float_flops: float  # FP32 (no tensor cores), FLOP/s
    bandwidth: float  # memory, bytes/s


GPUS = {
    'a100': GpuPeaks('NVIDIA A100 SXM4 80GB', 312e12, 19.5e12, 2.039e12),
    'h100': GpuPeaks('NVIDIA H100 SXM5', 989.4e12, 66.9e12, 3.35e12),
    'h200': GpuPeaks('NVIDIA H200 SXM', 989.4e12, 66.9e12, 4.8e12),
}
HALF = (torch.float16, torch.bfloat16)


def tensor_bytes(tensor):
    """Bytes of the distinct elements of ``tensor`` (a dimension of stride 0 counts once)."""
    count = 1
    for size, stride in zip(tensor.shape, tensor.stride()):
        if stride != 0:
            count *= size
    return count * tensor.element_size()


def _tensors(tree):
    from torch.utils._pytree import tree_leaves
    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def operator_flops(func, args, kwargs, out):
    """Floating-point operations of aten operator ``func`` by torch's flop counter (0 where it counts none);
    the CPU's fused attention by the formulas of CUDA's; a grouped convolution's backward by its forward's."""
    from torch.utils import flop_counter
    name = func.__name__.split('.')[0]
    if name == '_scaled_dot_product_flash_attention_for_cpu':
        query, key, value = args[:3]
        return flop_counter.sdpa_flop_count(query.shape, key.shape, value.shape)
    if name == '_scaled_dot_product_flash_attention_for_cpu_backward':
        grad_out, query, key, value = args[:4]
        return flop_counter.sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)
    if name == 'convolution_backward' and not args[7] and args[9] != 1:
        # a grouped convolution (not transposed): each gradient asked for has the forward's products (torch's
        # counter leaves the groups out of the weight gradient's, counting a depthwise one channels times over)
        grad_out, inputs, weight, output_mask = args[0], args[1], args[2], args[10]
        products = flop_counter.conv_flop_count(inputs.shape, weight.shape, grad_out.shape)
        return products * sum(map(bool, output_mask[:2]))
    count = flop_counter.flop_registry.get(func._overloadpacket)
    return 0 if count is None else count(*args, **kwargs, out_val=out)


# the packages whose code the forward's operators are named by with ``by_source`` (the innermost frame of one)
SOURCE_PACKAGES = ('mmpola', 'timm', 'mmdet', 'mmcv')


def _source_folders():
    return tuple(osp.dirname(sys.modules[name].__file__) + osp.sep for name in SOURCE_PACKAGES if name in sys.modules)


# mmpola's helper that applies every autograd Function of its ops: a node made there is named by its caller's line
_APPLY_HELPER = osp.join('mmpola', 'ops', 'dispatch.py')


def _recorded_line(node):
    """The innermost line of the models' packages in the forward's stack that autograd's anomaly mode recorded for
    ``node`` (``file.py:line``; past mmpola's helper that applies its ops' Functions), or None where it recorded
    none."""
    stack = node.metadata.get('traceback_') if hasattr(node, 'metadata') else None
    if not stack:
        return None
    folders = _source_folders()
    for entry in reversed(''.join(stack).splitlines()):  # '  File "PATH", line N, in NAME', innermost last
        entry = entry.strip()
        if entry.startswith('File "'):
            path, _, rest = entry[6:].partition('", line ')
            if path.startswith(folders) and not path.endswith(_APPLY_HELPER):
                return f'{osp.basename(path)}:{rest.split(",")[0]}'
    return None


def operator_source():
    """Where the operator being dispatched comes from: in a backward the autograd node running it (its type's
    name, and the line of the models' code that made it where anomaly mode recorded the forward's stack:
    :func:`_recorded_line`), else the innermost frame of the models' packages (:data:`SOURCE_PACKAGES`, those
    imported) as ``file.py:line``; '?' where there is none."""
    node = torch._C._current_autograd_node()
    if node is not None:
        line = _recorded_line(node)
        return type(node).__name__ if line is None else f'{type(node).__name__} {line}'
    folders = _source_folders()
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(folders):
            return f'{osp.basename(filename)}:{frame.f_lineno}'
        frame = frame.f_back
    return '?'


class Roofline:
    """The roofline bound of the kernels added to it, per kind of kernel (operator or Triton kernel name; with
    ``by_source``, each operator's kind with its source, :func:`operator_source`):
    ``rows[kind] = [kernels, FLOPs, bytes, seconds]``."""

    def __init__(self, peaks, by_source=False):
        self.peaks = peaks
        self.by_source = by_source
        self.rows = collections.defaultdict(lambda: [0, 0, 0, 0.0])

    def _add(self, kind, flops, nbytes, half):
        rate = self.peaks.half_flops if half else self.peaks.float_flops
        row = self.rows[kind]
        row[0] += 1
        row[1] += flops
        row[2] += nbytes
        row[3] += max(flops / rate, nbytes / self.peaks.bandwidth)

    def add_operator(self, func, args, kwargs, out):
        """One aten operator that launches a kernel: ``func(*args, **kwargs)`` returned ``out``."""
        inputs = _tensors((args, kwargs))
        nbytes = sum(tensor_bytes(t) for t in inputs + _tensors(out))
        half = any(t.dtype in HALF for t in inputs)
        kind = func.__name__.split('.')[0]
        if self.by_source:
            kind += ' @ ' + operator_source()
        self._add(kind, operator_flops(func, args, kwargs, out), nbytes, half)

    def add_launches(self, launches):
        """Triton kernel launches recorded by a dry run (``mmpola.ops.triton_support.Launch``)."""
        for record in launches:
            kernel = getattr(record.kernel, 'fn', record.kernel)  # an autotuner's kernel
            # a tensor passed twice (a pointer the kernel does not read, e.g. an absent bias) counts once
            tensors = {(a.data_ptr(), a.shape, a.stride()): a for a in record.args if isinstance(a, torch.Tensor)}
            nbytes = sum(tensor_bytes(a) for a in tensors.values())
            self._add('triton:' + getattr(kernel, '__name__', type(kernel).__name__), 0, nbytes, True)

    def totals(self):
        """(kernels, FLOPs, bytes, seconds) of all the kernels added."""
        return tuple(sum(row[i] for row in self.rows.values()) for i in range(4))

    def top(self, count):
        """The ``count`` kinds of kernel with the largest bound: (kind, kernels, FLOPs, bytes, seconds)."""
        ranked = sorted(self.rows.items(), key=lambda item: -item[1][3])
        return [(kind, *row) for kind, row in ranked[:count]]
