"""What the ``'triton'`` implementations of the attention ops share: where they run, and launch helpers.

The kernels run on CUDA tensors. With ``TRITON_INTERPRET=1`` (set before Triton is imported) Triton
runs them on the CPU through its interpreter, slowly but with the same arithmetic: that is how the
test suite checks them on machines without a GPU (tests/conftest.py sets it there).
"""
import functools
import importlib.util
import os

import torch

__all__ = ['interpreting', 'triton_available', 'triton_unsupported', 'KERNEL_DTYPES']

# the input dtypes the kernels load (they accumulate in float32; float64 only in the interpreter)
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def interpreting():
    """True when Triton runs kernels through its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get('TRITON_INTERPRET', '0') not in ('', '0')


@functools.lru_cache(maxsize=None)
def triton_available():
    """None when the ``triton`` package imports, else why not."""
    if importlib.util.find_spec('triton') is None:
        return 'the triton package is not installed (pip install triton; it ships with CUDA builds of torch)'
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception as err:  # a broken install
        return f'triton does not import ({type(err).__name__}: {str(err).strip().splitlines()[0][:120]})'
    return None


@functools.lru_cache(maxsize=None)
def _cuda_unsupported(index):
    major, minor = torch.cuda.get_device_capability(index)
    if major < 7 or (major, minor) < (7, 5):
        return (f'the Triton kernels need a GPU of compute capability 7.5 or newer, this one is {major}.{minor}; '
                "use attn_impl='fast'")
    return None


def triton_unsupported(device, dtype=None):
    """None when the Triton kernels run on tensors of ``device`` and ``dtype``, else why not (one line).

    CUDA tensors of float32 / float16 / bfloat16 on a GPU of compute capability >= 7.5 (bfloat16:
    >= 8.0); CPU tensors only under ``TRITON_INTERPRET=1`` (float64 too, for tests).
    """
    device = torch.device(device)
    reason = triton_available()
    if reason is not None:
        return reason
    if device.type == 'cpu':
        if not interpreting():
            return ("the Triton kernels run on CUDA tensors, these are on the CPU; use attn_impl='auto' or "
                    "'fast' there (TRITON_INTERPRET=1 runs the kernels on the CPU, slowly, for tests)")
        if dtype is not None and dtype not in KERNEL_DTYPES + (torch.float64,):
            return f'the Triton kernels take float32, float16 or bfloat16 tensors, got {dtype}'
        return None
    if device.type != 'cuda':
        return f"the Triton kernels run on CUDA tensors, these are on {device.type}; use attn_impl='fast'"
    if dtype is not None and dtype not in KERNEL_DTYPES:
        return f"the Triton kernels take float32, float16 or bfloat16 CUDA tensors, got {dtype}; use attn_impl='fast'"
    index = device.index if device.index is not None else torch.cuda.current_device()
    reason = _cuda_unsupported(index)
    if reason is None and dtype == torch.bfloat16 and torch.cuda.get_device_capability(index)[0] < 8:
        reason = "bfloat16 Triton kernels need a GPU of compute capability 8.0 or newer; use attn_impl='fast'"
    return reason
