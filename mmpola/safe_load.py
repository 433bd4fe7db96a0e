"""Safe checkpoint loading under ``torch.load(weights_only=True)`` (torch >= 2.6 default).

torch refuses every pickled global that it does not know. Two kinds of checkpoints our users load
carry a few such globals:

* checkpoints written by mmengine runs (resume, test, init from a checkpoint) store numpy arrays and
  scalars and mmengine's ``HistoryBuffer`` in ``meta`` / ``message_hub``; ``HistoryBuffer`` pickles
  its statistics methods as ``getattr(HistoryBuffer, 'mean')``;
* official PolaFormer checkpoints store the training config as a ``yacs.config.CfgNode``.

Instead of falling back to ``weights_only=False`` (which runs whatever code the pickle names), we
allowlist exactly those types. ``getattr`` is replaced by a stand-in that only resolves the
statistics methods of ``HistoryBuffer``, and ``CfgNode`` by a plain dict subclass, so yacs does not
need to be installed and nothing from the file is executed. Any other global is still refused.
"""
import collections
import os.path as osp

import numpy as np
import torch

__all__ = ['register_safe_globals', 'safe_torch_load', 'OfficialConfigNode', 'UnsafeCheckpointError']


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint names Python objects outside the allowlist; it was not loaded."""


class OfficialConfigNode:
    """Stand-in for ``yacs.config.CfgNode`` (the training config inside official checkpoints).

    torch's weights-only unpickler fills only exact ``dict``/``OrderedDict`` instances, so the
    stand-in creates an ``OrderedDict``: the config comes back as nested ordered dicts (yacs' own
    attributes such as ``__immutable__`` land in the instance ``__dict__``). yacs need not be
    installed and nothing from the file runs.
    """

    def __new__(cls, *args, **kwargs):
        return collections.OrderedDict()


def _history_buffer_getattr(obj, name):
    """``getattr`` restricted to what mmengine's HistoryBuffer pickles: its statistics methods."""
    from mmengine.logging import HistoryBuffer
    allowed = {'min', 'max', 'current', 'mean'} | set(HistoryBuffer._statistics_methods)
    if obj is HistoryBuffer and name in allowed:
        return getattr(obj, name)
    raise UnsafeCheckpointError(
        f'checkpoint asks for getattr({obj!r}, {name!r}); only the statistics methods of '
        'mmengine.logging.HistoryBuffer are allowed')


def _numpy_globals():
    out = [np.ndarray, np.dtype]
    try:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy 2.x
        from numpy._core.multiarray import _reconstruct, scalar
    out += [_reconstruct, scalar]
    # numpy >= 1.25 pickles dtype instances by their class (numpy.dtypes.Float64DType ...)
    dtypes = getattr(np, 'dtypes', None)
    if dtypes is not None:
        out += [getattr(dtypes, n) for n in dir(dtypes) if n.endswith('DType')]
    # numpy 1.x pickles arrays with numpy.core.*; numpy 2 with numpy._core.*; a checkpoint written
    # with either must load with the other, so register both spellings.
    named = []
    for mod in ('numpy.core.multiarray', 'numpy._core.multiarray'):
        named += [(_reconstruct, f'{mod}._reconstruct'), (scalar, f'{mod}.scalar')]
    return out, named


_REGISTERED = False


def register_safe_globals():
    """Allowlist the types mmengine and official PolaFormer checkpoints contain (idempotent)."""
    global _REGISTERED
    if _REGISTERED or not hasattr(torch.serialization, 'add_safe_globals'):
        return
    plain, named = _numpy_globals()
    safe = list(plain) + named
    try:
        from mmengine.logging import HistoryBuffer
        safe += [HistoryBuffer, (_history_buffer_getattr, 'builtins.getattr')]
    except ImportError:  # mmengine is optional for plain timm users
        pass
    safe.append((OfficialConfigNode, 'yacs.config.CfgNode'))
    torch.serialization.add_safe_globals(safe)
    _REGISTERED = True


def safe_torch_load(path, map_location='cpu'):
    """``torch.load(path, weights_only=True)`` with the allowlist and an actionable error."""
    register_safe_globals()
    if isinstance(path, str) and not osp.isfile(path):
        raise FileNotFoundError(
            f'checkpoint file {path!r} does not exist; check the path (init_cfg.checkpoint, '
            '--resume, --checkpoint or checkpoint_path)')
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises UnpicklingError wrapped in various types
        msg = str(e)
        if 'Weights only load failed' in msg or 'Unsupported global' in msg or 'UnpicklingError' in msg:
            detail = [line.strip() for line in msg.splitlines() if 'Unsupported' in line]
            raise UnsafeCheckpointError(
                f'refused to load {path!r}: it contains Python objects outside the allowlist of '
                f"mmpola's safe loader ({detail[0] if detail else msg.splitlines()[0]}). Loading it "
                'would let the file run code. If you trust its origin, re-save only its tensors '
                "(torch.save({'state_dict': sd}, new_path)) in a trusted environment and load that."
            ) from e
        raise
