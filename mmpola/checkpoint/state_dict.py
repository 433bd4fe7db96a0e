"""Operations on the tensors of a checkpoint: take them out of their container, find the wrapper
prefix, resize grid-shaped tensors to the model."""
import math
import re
from collections import OrderedDict

import torch
import torch.nn.functional as F

from mmpola.errors import MMPolaUserError

__all__ = ['CheckpointMismatchError', 'NonFiniteCheckpointError', 'extract_state_dict', 'find_key_prefix',
           'resize_state_dict', 'nonfinite_tensors', 'check_finite']

_EMA_KEYS = ('state_dict_ema', 'model_ema')


class CheckpointMismatchError(MMPolaUserError, ValueError):
    """The checkpoint does not fit the model (no matching key, another architecture or attention kind)."""


class NonFiniteCheckpointError(CheckpointMismatchError):
    """The checkpoint holds weights that are NaN or infinite."""


def nonfinite_tensors(tensors):
    """``[(name, NaN count, inf count)]`` of the floating-point tensors in ``tensors`` (a mapping) that
    hold NaN or infinite values, in their order."""
    out = []
    for name, value in tensors.items():
        if not torch.is_tensor(value) or not (value.is_floating_point() or value.is_complex()):
            continue
        if value.device.type == 'meta' or bool(torch.isfinite(value).all()):
            continue
        out.append((str(name), int(torch.isnan(value).sum()), int(torch.isinf(value).sum())))
    return out


def check_finite(tensors, source, what='weights'):
    """Raise :class:`NonFiniteCheckpointError` when any floating-point tensor of ``tensors`` (what a
    loader is about to load from ``source``, how messages name the checkpoint:
    :func:`~mmpola.checkpoint.checkpoint_source`) holds NaN or infinite values, naming the first few and their
    count.

    A model loaded from such a file predicts nothing (tools/test.py: an empty result set, no metric)
    or stops its training at the first iteration with a non-finite loss, which points at the data or
    the learning rate instead of the file."""
    bad = nonfinite_tensors(tensors)
    if not bad:
        return
    total = sum(1 for v in tensors.values() if torch.is_tensor(v) and v.is_floating_point())

    def count(nan, inf):
        return ', '.join(p for p in (f'{nan} NaN' if nan else '', f'{inf} inf' if inf else '') if p)

    shown = '; '.join(f'{name} ({count(nan, inf)})' for name, nan, inf in bad[:5])
    more = f' and {len(bad) - 5} more' if len(bad) > 5 else ''
    raise NonFiniteCheckpointError(
        f'{source} holds non-finite {what}: {len(bad)} of its {total} floating-point tensors have NaN '
        f'or infinite values ({shown}{more}), so a model loaded from it would predict nothing or train on NaN. '
        'It was written after the training diverged, or the file is damaged: use an earlier checkpoint of '
        'that run (written before its loss became NaN), or download or copy the file again.')


def extract_state_dict(checkpoint, use_ema=True):
    """The tensors of a checkpoint container.

    EMA weights win with ``use_ema`` (``state_dict_ema`` / ``model_ema``, as timm); mmengine's
    EMAHook already stores the EMA weights in ``state_dict`` (its ``ema_state_dict`` then holds the
    raw weights), so that key is never used.

    Returns:
        (OrderedDict name -> tensor, description of where they came from)
    """
    if not isinstance(checkpoint, dict):
        raise TypeError(f'checkpoint must be a dict, got {type(checkpoint).__name__}')
    if use_ema:
        for key in _EMA_KEYS:
            if isinstance(checkpoint.get(key), dict) and checkpoint[key]:
                return OrderedDict(checkpoint[key]), f"'{key}' (EMA weights)"
    for key in ('state_dict', 'model', 'module'):
        if isinstance(checkpoint.get(key), dict):
            return OrderedDict(checkpoint[key]), f"'{key}'"
    tensors = OrderedDict((k, v) for k, v in checkpoint.items() if torch.is_tensor(v))
    if not tensors:
        raise CheckpointMismatchError(
            f'checkpoint holds no tensors and none of the keys state_dict / model / '
            f'{" / ".join(_EMA_KEYS)}; its top-level keys: {sorted(checkpoint)[:10]}')
    return tensors, 'the bare state dict'


def find_key_prefix(checkpoint_keys, model_keys, min_fraction=0.5):
    """The wrapper prefix under which most checkpoint keys name a model key.

    A candidate prefix is made of non-numeric name parts (``module.``, ``backbone.``,
    ``model.backbone.`` ..., never a ModuleList index such as ``block1.0.``), and at least
    ``min_fraction`` of the checkpoint keys under it must name a model key, so a few look-alike
    leaf names (``norm1.weight``) cannot make a wrong prefix win.

    Returns:
        (prefix, number of matching keys); ('', 0) when nothing matches. Ties go to the shorter
        prefix.
    """
    model_keys = set(model_keys)
    checkpoint_keys = list(checkpoint_keys)
    counts = {}
    for key in checkpoint_keys:
        for pos in [0] + [m.end() for m in re.finditer(r'\.', key)]:
            prefix = key[:pos]
            if any(part.isdigit() for part in prefix.split('.')[:-1]):
                break
            if key[pos:] in model_keys:
                counts[prefix] = counts.get(prefix, 0) + 1
    valid = {p: n for p, n in counts.items()
             if n >= min_fraction * sum(1 for k in checkpoint_keys if k.startswith(p))}
    if not valid:
        return '', 0
    prefix = max(valid, key=lambda p: (valid[p], -len(p)))
    return prefix, valid[prefix]


def _grid_side(length, what):
    side = math.isqrt(length)
    if side * side != length:
        raise CheckpointMismatchError(f'{what} has {length} tokens, not a square grid; cannot resize')
    return side


def _prefix_tokens(length, target_length):
    """The number of prefix tokens (a ViT's class token) in front of a square grid in both lengths."""
    for prefix in (0, 1, 2):
        if all(math.isqrt(n - prefix) ** 2 == n - prefix for n in (length, target_length)):
            return prefix
    return 0


def resize_state_dict(state_dict, model_state):
    """Resize grid-shaped tensors whose pretraining grid differs from the model's: ``pos_embed{i}``,
    a ViT's ``pos_embed`` (its class token's entry kept as it is, the grid resized) and
    ``*.positional_encoding`` (2-D bicubic, as the official fine-tuning loader and mmseg's / timm's ViT
    loaders) and ``*.relative_position_bias_table`` (bicubic, as mmdet).

    Args:
        state_dict: name -> tensor, already in the model's key space.
        model_state: the model's state dict (shapes only are used).

    Returns:
        (new state dict, list of 'key: old shape -> new shape' strings)
    """
    out = OrderedDict()
    resized = []
    for key, value in state_dict.items():
        target = model_state.get(key)
        if target is None or tuple(value.shape) == tuple(target.shape):
            out[key] = value
            continue
        leaf = key.rsplit('.', 1)[-1]
        new = None
        if (re.fullmatch(r'pos_embed\d*', leaf) or leaf == 'positional_encoding') and \
                value.dim() == 3 and target.dim() == 3 and value.shape[2] == target.shape[2]:
            prefix = _prefix_tokens(value.shape[1], target.shape[1]) if leaf == 'pos_embed' else 0
            src = _grid_side(value.shape[1] - prefix, key)
            dst = _grid_side(target.shape[1] - prefix, f'model {key}')
            grid = value[:, prefix:].float().reshape(1, src, src, -1).permute(0, 3, 1, 2)
            grid = F.interpolate(grid, size=(dst, dst), mode='bicubic', align_corners=False)
            new = torch.cat([value[:, :prefix], grid.flatten(2).transpose(1, 2).to(value.dtype)], dim=1)
        elif leaf == 'relative_position_bias_table' and value.dim() == 2 and \
                value.shape[1] == target.shape[1]:
            src = _grid_side(value.shape[0], key)
            dst = _grid_side(target.shape[0], f'model {key}')
            heads = value.shape[1]
            table = value.float().permute(1, 0).reshape(1, heads, src, src)
            table = F.interpolate(table, size=(dst, dst), mode='bicubic', align_corners=False)
            new = table.view(heads, dst * dst).permute(1, 0).contiguous().to(value.dtype)
        if new is None:
            out[key] = value  # left for the caller to report as a shape mismatch
        else:
            out[key] = new
            resized.append(f'{key}: {tuple(value.shape)} -> {tuple(new.shape)}')
    return out, resized
