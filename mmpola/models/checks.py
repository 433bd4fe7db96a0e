"""The argument checks of the backbones and the classifier, and their error (:class:`PolaConfigError`).

Every error names the problem and the fix.
"""

import torch

from mmpola.errors import MMPolaUserError, close_matches

from .layers import to_2tuple_int

__all__ = ['PolaConfigError', 'is_pretrained_cfg', 'check_pretrained_cfg', 'resolve_arch', 'check_out_indices',
           'check_frozen_stages', 'check_stage_string', 'check_input', 'square_pretrain_size']


class PolaConfigError(MMPolaUserError, ValueError):
    """A backbone argument or input the user can fix (arch, out_indices, frozen_stages, input size).

    A ``ValueError``, so existing ``except ValueError`` code still sees it; mmpola's tools print it
    without a traceback.
    """


def is_pretrained_cfg(init_cfg):
    return isinstance(init_cfg, dict) and init_cfg.get('type') == 'Pretrained'


# the keys of a backbone's init_cfg=dict(type='Pretrained', ...) (mmpola.checkpoint.load_checkpoint)
PRETRAINED_KEYS = ('type', 'checkpoint', 'prefix', 'use_ema', 'map_final_norm', 'strict', 'map_location')


def check_pretrained_cfg(init_cfg, owner):
    """``init_cfg`` if it is a complete ``dict(type='Pretrained', ...)`` of known keys, else a
    :class:`PolaConfigError` naming the unknown key (and the closest known one) or the missing
    checkpoint: a misspelled ``strict`` or ``prefix`` would otherwise be ignored without a word."""
    unknown = [key for key in init_cfg if key not in PRETRAINED_KEYS]
    if unknown:
        hints = [f'{key!r}' + (f' (did you mean {close[0]!r}?)' if close else '')
                 for key in unknown for close in [close_matches(key, PRETRAINED_KEYS, n=1)]]
        raise PolaConfigError(f"{owner}: init_cfg=dict(type='Pretrained', ...) has unknown key(s) {', '.join(hints)}; "
                              f"its keys are {', '.join(PRETRAINED_KEYS)}")
    if not init_cfg.get('checkpoint'):
        raise PolaConfigError(f"{owner}: init_cfg=dict(type='Pretrained', ...) names no checkpoint; add "
                              "checkpoint=PATH_OR_URL, or set init_cfg=None to start from random weights")
    return init_cfg


def resolve_arch(arch, arch_settings, required, name):
    if isinstance(arch, str):
        key = arch.lower()
        if key not in arch_settings:
            raise PolaConfigError(f'unknown arch {arch!r} for {name}; valid: {", ".join(arch_settings)} '
                             f'or a dict with keys {", ".join(required)}')
        return dict(arch_settings[key])
    if isinstance(arch, dict):
        missing = [k for k in required if k not in arch]
        extra = [k for k in arch if k not in required]
        if missing or extra:
            raise PolaConfigError(f'a custom arch for {name} needs exactly the keys {", ".join(required)}; '
                             f'missing {missing}, unknown {extra}')
        return dict(arch)
    raise TypeError(f'arch must be a preset name or a dict, got {type(arch).__name__}')


def check_out_indices(out_indices, num_stages, name):
    if isinstance(out_indices, int):
        out_indices = (out_indices,)
    out_indices = tuple(out_indices)
    if not out_indices:
        raise PolaConfigError(f'{name}: out_indices is empty; pass stages from 0 to {num_stages - 1}')
    for i in out_indices:
        if not isinstance(i, int) or not 0 <= i < num_stages:
            raise PolaConfigError(f'{name}: out_indices {out_indices} out of range; '
                             f'valid stages are 0..{num_stages - 1}')
    return out_indices


def check_frozen_stages(frozen_stages, num_stages, name):
    if not isinstance(frozen_stages, int) or not -1 <= frozen_stages <= num_stages:
        raise PolaConfigError(f'{name}: frozen_stages={frozen_stages!r} is beyond the depth of the model; '
                         f'use -1 (nothing), 0 (patch embedding) .. {num_stages} (all stages)')
    return frozen_stages


def check_stage_string(value, allowed, num_stages, what):
    if not isinstance(value, str) or len(value) != num_stages or any(c not in allowed for c in value):
        raise PolaConfigError(f'{what} must be a string of {num_stages} characters from '
                         f'{allowed!r}, got {value!r}')
    return value


def check_input(x, in_channels, min_size, name, reason='four stages down to stride 32'):
    if isinstance(x, torch.fx.Proxy):  # symbolic tracing: no shape to check
        return
    if not torch.is_tensor(x) or x.dim() != 4:
        shape = tuple(x.shape) if torch.is_tensor(x) else type(x).__name__
        raise PolaConfigError(f'{name} expects a 4-D (B, C, H, W) image tensor, got {shape}')
    if x.shape[1] != in_channels:
        raise PolaConfigError(f'{name} was built for {in_channels} input channels, got {x.shape[1]} '
                         f'(input shape {tuple(x.shape)}); set in_channels={x.shape[1]}')
    H, W = x.shape[-2:]
    if H < min_size or W < min_size:
        raise PolaConfigError(f'{name}: input size {H}x{W} is smaller than the minimum {min_size}x{min_size} '
                              f'({reason}); resize or pad the image (in a config: the size its pipeline\'s Resize '
                              'gives such an image, e.g. keep_ratio=True with a scale that leaves its short side at '
                              f'{min_size} or more)')


def square_pretrain_size(value, owner=None):
    """``pretrain_img_size`` (``224`` or ``(224, 224)``) -> ``(224, 224)``, refused unless square
    (official models are); ``owner`` (a class name) starts the message."""
    size = to_2tuple_int(value, 'pretrain_img_size')
    if size[0] != size[1]:
        raise PolaConfigError(f'{owner + ": " if owner else ""}pretrain_img_size must be square (official models '
                              f'are), got {size}')
    return size
