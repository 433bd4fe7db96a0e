"""Keep glibc malloc from returning large CPU tensors to the kernel after every use.

Dense prediction on the CPU allocates tensors of tens to hundreds of MiB in every layer (PVT stage 1
at 1600x2666 has 266k tokens; its MLP hidden state alone is 545 MiB). glibc serves every block above
its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and unmaps it on free, so each of them is
page-faulted and zero-filled by the kernel again at the next use, which shows as system time. The
settings below keep such blocks in the heap for reuse; docs/benchmarks.md has the measured effect
(``tools/benchmark.py`` with ``--malloc tuned`` and ``--malloc default``). The cost is that the
process keeps its peak heap.

The same advice is given for PyTorch on CPUs generally (tcmalloc/jemalloc or these glibc knobs);
this does it in-process, with ``mallopt``, for mmpola's own tools (train, test, demos, benchmark).
Library imports never change the allocator. Opt out with ``MMPOLA_MALLOC_TUNING=0``; explicit
``MALLOC_*_`` environment variables or a preloaded allocator are left alone.
"""
import ctypes
import ctypes.util
import os
import platform

_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

_STATE = {'applied': None}


def _glibc():
    if platform.system() != 'Linux' or platform.libc_ver()[0] != 'glibc':
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library('c') or 'libc.so.6')
    except OSError:
        return None


def tune_malloc(trim_threshold=2**31 - 1, top_pad=1 << 30, mmap_threshold=2**31 - 1):
    """Raise glibc's mmap and trim thresholds so freed tensors are reused without page faults.

    Returns a one-line description of what was done (printed by the tools), idempotent.
    """
    if _STATE['applied'] is not None:
        return _STATE['applied']
    if os.environ.get('MMPOLA_MALLOC_TUNING', '1').strip().lower() in ('0', 'false', 'no', 'off'):
        reason = 'off (MMPOLA_MALLOC_TUNING=0)'
    elif any(key.startswith('MALLOC_') and key.endswith('_') for key in os.environ) or \
            'malloc' in os.environ.get('LD_PRELOAD', '') or 'jemalloc' in os.environ.get('LD_PRELOAD', ''):
        reason = 'left to the environment (MALLOC_*_ or LD_PRELOAD set)'
    else:
        libc = _glibc()
        if libc is None:
            reason = 'not applicable (not glibc)'
        else:
            ok = all(libc.mallopt(option, ctypes.c_int(value)) == 1
                     for option, value in ((_M_MMAP_THRESHOLD, mmap_threshold),
                                           (_M_TRIM_THRESHOLD, trim_threshold), (_M_TOP_PAD, top_pad)))
            reason = 'on (glibc mmap/trim thresholds raised)' if ok else 'mallopt refused; defaults kept'
    _STATE['applied'] = reason
    return reason
