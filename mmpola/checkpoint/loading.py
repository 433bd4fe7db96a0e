"""Load PolaFormer weights into the backbones (docs/design.md, "Checkpoints: official names,
loading is a filter").

Accepted inputs, all read with :func:`mmpola.checkpoint.reading.safe_torch_load` (weights only, no yacs):

* official PolaFormer files ``{'model': state_dict, 'config': CfgNode, ...}``;
* mmengine / mmdet / mmseg checkpoints ``{'state_dict': ...}`` (detector or segmentor keys
  ``backbone.*``, a classifier's ``backbone.*`` ...);
* bare state dicts, with or without ``module.`` / ``backbone.`` prefixes;
* EMA weights: with ``use_ema=True`` (default, as timm) ``state_dict_ema`` or ``model_ema`` win
  when present. mmengine's EMAHook already stores the EMA weights in ``state_dict`` (its
  ``ema_state_dict`` then holds the raw weights), so that key is never used.

What happens to the keys:

1. the prefix is found automatically as the one under which most checkpoint keys name a model
   parameter (``''``, ``module.``, ``backbone.``, ``module.backbone.`` ...), or given explicitly;
2. dropped: the classification ``head.*`` and ``norm.*`` (Pola-PVT's final norm is never used;
   Pola-Swin's can be copied into ``norm3`` with ``map_final_norm=True``), run-time buffers
   ``*.attn_mask`` and ``*.relative_position_index`` (recomputed by the model);
3. resized when the pretraining grid differs: ``pos_embed{i}`` and ``*.positional_encoding``
   (2-D bicubic, as the official fine-tuning loader) and ``*.relative_position_bias_table``
   (bicubic, as mmdet);
4. ``load_state_dict(strict=False)``, then a log line with counts of loaded / missing /
   unexpected / dropped / resized keys. A checkpoint matching nothing is an error.
"""
import logging
import math
import os
import re
from collections import OrderedDict

import torch
import torch.nn.functional as F

from mmpola.errors import MMPolaUserError

from .reading import download_checkpoint, safe_torch_load

__all__ = ['read_checkpoint', 'extract_state_dict', 'find_key_prefix', 'resize_state_dict',
           'load_pola_checkpoint', 'describe_checkpoint', 'check_checkpoint_family', 'LoadReport',
           'CheckpointMismatchError']

_RUNTIME_BUFFERS = ('attn_mask', 'relative_position_index')
_EMA_KEYS = ('state_dict_ema', 'model_ema')


class CheckpointMismatchError(MMPolaUserError, ValueError):
    """The checkpoint does not fit the model (no matching key, wrong architecture)."""


class LoadReport(dict):
    """What a load did: lists of keys under 'loaded', 'missing', 'unexpected', 'dropped',
    'resized', 'mismatched', plus 'prefix' and 'source'. Attribute access for convenience."""

    __getattr__ = dict.__getitem__


def _log(msg, logger, level=logging.INFO):
    if logger is None:
        return
    if isinstance(logger, logging.Logger):
        logger.log(level, msg)
        return
    from mmengine.logging import print_log
    print_log(msg, logger=logger, level=level)


def read_checkpoint(source, map_location='cpu'):
    """Path, URL or an already loaded object -> the loaded object (never runs pickled code).

    URLs are downloaded once into ``$TORCH_HOME/hub/checkpoints`` (torch hub's cache, which timm shares),
    named by :func:`mmpola.checkpoint.sources.cache_file_name`: a file put there by hand is used as is.
    """
    if isinstance(source, (dict, OrderedDict)):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f'checkpoint must be a path, a URL or a state dict, got {type(source).__name__}')
    source = os.fspath(source)
    if source.startswith(('http://', 'https://')):
        source = download_checkpoint(source)
    return safe_torch_load(source, map_location=map_location)


def extract_state_dict(checkpoint, use_ema=True):
    """The tensors of a checkpoint container.

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


def resize_state_dict(state_dict, model_state):
    """Resize grid-shaped tensors whose pretraining grid differs from the model's.

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
        if (re.fullmatch(r'pos_embed\d+', leaf) or leaf == 'positional_encoding') and \
                value.dim() == 3 and target.dim() == 3 and value.shape[2] == target.shape[2]:
            src = _grid_side(value.shape[1], key)
            dst = _grid_side(target.shape[1], f'model {key}')
            grid = value.float().reshape(1, src, src, -1).permute(0, 3, 1, 2)
            grid = F.interpolate(grid, size=(dst, dst), mode='bicubic', align_corners=False)
            new = grid.flatten(2).transpose(1, 2).to(value.dtype)
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


def _family_of(kind, layout):
    """(family name, registered backbone type) of an attention kind in a layout: ('Pola-Swin',
    'PolaSwin'); PolaFormer++'s own layout: ('PolaFormer++', 'PolaPP')."""
    from mmpola.models.attention_kinds import get_attention_kind
    if layout == 'polapp':
        return 'PolaFormer++', 'PolaPP'
    family = 'PVT' if layout == 'pvt' else 'Swin'
    title = get_attention_kind(kind).title
    return f'{title}-{family}', f'{title}{family}'


def _kind_title(kind, layout):
    """'Pola-Swin (type="PolaSwin")' for a linear kind; None for softmax."""
    if kind == 'softmax':
        return None
    family, type_name = _family_of(kind, layout)
    return f'{family} (type="{type_name}")'


def _checkpoint_kinds(keys):
    """``[(kind, layout), ...]`` of the attention modules of a state dict (identified ones only)."""
    from mmpola.models.attention_kinds import kinds_in_state_dict
    return [k for k in kinds_in_state_dict(keys).values() if k is not None]


def _guess_family(keys):
    joined = '\n'.join(keys)
    for kind, layout in _checkpoint_kinds(keys):
        if kind != 'softmax':
            return _kind_title(kind, layout)
    # attention kinds without a table entry
    if re.search(r'(^|\.)(layers\.0\.blocks\.0|block1\.0)\.attn\.residual\.0\.weight$', joined, re.M):
        return 'InLine (injective linear attention; not Pola)'
    if re.search(r'(^|\.)(layers\.0\.blocks\.0|block1\.0)\.attn\.dwc\.weight$', joined, re.M) and \
            not re.search(r'\.attn\.power$', joined, re.M):
        return 'FLatten (focused linear attention; not Pola)'
    if re.search(r'(^|\.)layers\.0\.blocks\.', joined, re.M):
        return 'Pola-Swin (type="PolaSwin")'
    if re.search(r'(^|\.)block1\.0\.', joined, re.M):
        return 'Pola-PVT (type="PolaPVT")'
    if re.search(r'(^|\.)stages\.0\.blocks\.', joined, re.M):
        return "mmdet/mmseg Swin (not Pola; no Pola attention weights)"
    if re.search(r'(^|\.)layers\.0\.0\.projection\.', joined, re.M):
        return "mmdet/mmseg PVT (not Pola; no Pola attention weights)"
    return None


# attention parameters that tell the linear-attention families apart (any key prefix)
_LINEAGES = (
    ('PolaFormer++', (r'\.attn\.qkvg\.', r'\.attn\.(s1|lepe\.)')),
    ('PolaFormer', (r'\.attn\.power$',)),
    ('InLine', (r'\.attn\.residual\.',)),
    ('FLatten Transformer', (r'\.attn\.scale$', r'\.attn\.dwc\.')),
)


def describe_checkpoint(checkpoint):
    """What a checkpoint (the loaded object) holds, in a few words, for error messages: the task
    (an mmdet detector, an mmseg segmentor, a classifier, a bare backbone), the attention family
    (PolaFormer, PolaFormer++, FLatten Transformer, InLine, softmax PVT/Swin) and whether it is in
    the official release format (``{'model': ..., 'config': ...}``)."""
    if not isinstance(checkpoint, dict):
        return f'a {type(checkpoint).__name__}, not a checkpoint dict'
    official = isinstance(checkpoint.get('model'), dict) and any(k in checkpoint for k in ('config', 'max_accuracy'))
    try:
        state_dict, _ = extract_state_dict(checkpoint, use_ema=False)
    except CheckpointMismatchError:
        return f'no weights (top-level keys {sorted(map(str, checkpoint))[:8]})'
    keys = [re.sub(r'^module\.', '', str(k)) for k in state_dict]
    joined = '\n'.join(keys)
    lineage = next((name for name, patterns in _LINEAGES
                    if all(re.search(p, joined, re.M) for p in patterns)), None)
    family = _guess_family(keys)
    if lineage is None and family is not None:
        lineage, arch = family.split(' (')[0], None
    elif lineage is None or lineage == 'PolaFormer++':  # one macro architecture of its own
        arch = None
    else:
        arch = ('PVT' if re.search(r'(^|\.)block1\.', joined, re.M) else
                'Swin' if re.search(r'(^|\.)layers\.0\.blocks\.', joined, re.M) else None)
    backbone = f"{lineage}{f' {arch}' if arch else ''}" if lineage else None
    if any(k.startswith(('roi_head.', 'rpn_head.', 'bbox_head.')) for k in keys):
        task = 'an mmdet detector checkpoint'
    elif any(k.startswith(('decode_head.', 'auxiliary_head.')) for k in keys):
        task = 'an mmseg segmentor checkpoint'
    elif any(re.match(r'(backbone\.)?head\.(fc\.)?weight$', k) for k in keys):
        head = next(state_dict[k] for k in state_dict if re.match(r'(module\.)?(backbone\.)?head\.(fc\.)?weight$', k))
        classes = f', {head.shape[0]}-class head' if getattr(head, 'dim', lambda: 0)() == 2 else ''
        task = ('an official ' if official else 'a ') + f'classification checkpoint{classes}'
    elif backbone:
        task = 'a backbone-only checkpoint'
    else:
        return f'a checkpoint of an unknown model (keys like {keys[:3]})'
    return f'{task} ({backbone})' if backbone else task


def _check_attention_kind(state_dict, model_state, source, name):
    """Refuse a checkpoint with none of the attention modules of the model's linear attention kind
    (a softmax PVT / Swin file, or weights of another kind: Pola into FLatten ...): loading it would
    fill everything around the attention and leave the model's attention randomly initialised."""
    from mmpola.models.attention_kinds import get_attention_kind, kinds_in_state_dict
    model_kinds = kinds_in_state_dict(model_state)
    linear = {kind for kind in model_kinds.values() if kind is not None and kind[0] != 'softmax'}
    found = set(_checkpoint_kinds(state_dict))
    for kind, layout in sorted(linear):
        if (kind, layout) in found:
            continue
        title = get_attention_kind(kind).title
        example = next(prefix for prefix, k in model_kinds.items() if k == (kind, layout))
        example += sorted(k for k in model_state if k.startswith(example))[0][len(example):]
        others = sorted(k for k in found if k[0] != 'softmax')
        softmax_fix = "build the backbone with attn_type='SSSS' (softmax attention in every stage) to use this one"
        if others:  # weights of another linear attention kind
            family, type_name = _family_of(*others[0])
            kind_desc = f'a {family} checkpoint'
            fix = f"build type='{type_name}' to use this one"
        elif ('softmax', 'pvt') in found or re.search(r'(^|\.)block1\.0\.attn\.q\.weight', '\n'.join(state_dict),
                                                      re.M):
            kind_desc, fix = 'a softmax PVT (PVT-v1) checkpoint', softmax_fix
        elif ('softmax', 'swin') in found:
            kind_desc, fix = 'a softmax Swin checkpoint', softmax_fix
        else:
            kind_desc, fix = f'not a {title} checkpoint', None
        raise CheckpointMismatchError(
            f'checkpoint {source} has none of the {title} attention weights of {name} (such as '
            f"'{example}'): it looks like {kind_desc}. Loading it would leave every {title} attention "
            f'randomly initialised. Use a checkpoint of {title} attention (official release or an mmpola '
            'classification run)' + (f', {fix}' if fix else '') +
            ', or train from random initialisation with init_cfg=None.')


def check_checkpoint_family(state_dict, model, source):
    """Refuse a checkpoint of another family for a model that declares ``family_key_suffixes`` (keys
    every checkpoint of its family has): look-alike names (``layers.0.blocks.0.attn.qkvg.weight`` in a
    Pola-Swin file, ``downsample.reduction`` in any Swin) would otherwise load a few tensors and leave
    the rest random."""
    suffixes = tuple(getattr(model, 'family_key_suffixes', ()))
    if not suffixes or any(key.endswith(suffixes) for key in state_dict):
        return
    name = type(model).__name__
    family = _guess_family(state_dict)
    raise CheckpointMismatchError(
        f'checkpoint {source} is not a {getattr(model, "official_name", name)} checkpoint: it has no key '
        f'ending in {suffixes[0]!r} (such as {getattr(model, "official_key_pattern", suffixes[0])!r})'
        + (f'; it looks like a {family} checkpoint' if family else '') +
        f'. Use a {getattr(model, "official_name", name)} checkpoint with {name} (official release or an '
        'mmpola classification run), build the backbone that fits this file, or train from random '
        'initialisation with init_cfg=None.')


def _infer_pvt_la_sr_ratios(state_dict, num_stages=4):
    """'1111'-style string of the Pola blocks' spatial reduction stored in a Pola-PVT checkpoint."""
    ratios = []
    for i in range(1, num_stages + 1):
        sr = state_dict.get(f'block{i}.0.attn.sr.weight')
        if sr is not None and f'block{i}.0.attn.positional_encoding' in state_dict:
            ratios.append(str(sr.shape[-1]))
        elif f'block{i}.0.attn.positional_encoding' in state_dict:
            ratios.append('1')
        else:
            return None  # softmax stage or not a Pola-PVT checkpoint
    return ''.join(ratios)


def load_pola_checkpoint(model, checkpoint, prefix=None, use_ema=True, map_final_norm=False,
                         strict=False, map_location='cpu', logger='current'):
    """Load a checkpoint into a :class:`PolaPVT` / :class:`PolaSwin` (or any module) by filtering.

    Args:
        model: the backbone.
        checkpoint: path, URL or already loaded dict (any container listed in the module doc).
        prefix: keep only keys starting with it and strip it (e.g. ``'backbone.'``); None finds it.
        use_ema: prefer ``state_dict_ema`` / ``model_ema`` when present.
        map_final_norm: copy the classification ``norm.*`` into ``norm3.*`` when the model has
            ``norm3`` (Pola-Swin: the trained LN after stage 4). Off by default, like mmdet.
        strict: raise if any model key is missing or any checkpoint key is left unused.
        map_location: device for reading.
        logger: mmengine logger name, a ``logging.Logger``, or None for silence.

    Returns:
        :class:`LoadReport`.

    Raises:
        CheckpointMismatchError: nothing matches, a Pola-PVT checkpoint with other
            ``la_sr_ratios``, or (strict) any missing/unexpected key.
    """
    source = checkpoint if isinstance(checkpoint, (str, os.PathLike)) else 'the given state dict'
    state_dict, origin = extract_state_dict(read_checkpoint(checkpoint, map_location), use_ema)
    model_state = model.state_dict()
    name = type(model).__name__
    hint = getattr(model, 'official_key_pattern', None) or (next(iter(model_state), '') + '*')

    if prefix is None:
        prefix, matched = find_key_prefix(state_dict, model_state)
    else:
        matched = sum(1 for k in state_dict if k.startswith(prefix) and k[len(prefix):] in model_state)
    pola_keys = [k for k in model_state if '.attn.' in k]
    if matched and pola_keys and not any(
            k.startswith(prefix) and '.attn.' in k and k[len(prefix):] in model_state for k in state_dict):
        matched = 0  # a few look-alike names (norms, patch embedding) but no attention weights
    if matched == 0:
        family = _guess_family(state_dict)
        sample = list(state_dict)[:3]
        msg = (f'checkpoint {source} has no key matching {name} (expected attention keys like '
               f"'{hint}'{', under prefix ' + repr(prefix) if prefix else ''}); ")
        msg += f'is it a {family} checkpoint? ' if family else ''
        msg += f'its keys look like {sample}. '
        if family and 'not Pola' in family:
            msg += ('A Pola backbone needs a PolaFormer checkpoint (official release or an mmpola '
                    'classification run), or train from random initialisation with init_cfg=None.')
        else:
            msg += ("Build the backbone that fits the checkpoint, or pass the right prefix (e.g. "
                    "init_cfg=dict(type='Pretrained', checkpoint=..., prefix='backbone.')).")
        raise CheckpointMismatchError(msg)

    outside = [k for k in state_dict if not k.startswith(prefix)]
    final_norm = {}
    if map_final_norm and prefix.endswith('backbone.'):
        # a classifier checkpoint keeps its final norm beside the backbone: '<outer>norm.*'
        outer = prefix[:-len('backbone.')]
        final_norm = {k[len(outer):]: v for k, v in state_dict.items()
                      if k.startswith(outer + 'norm.')}
    state_dict = OrderedDict((k[len(prefix):], v) for k, v in state_dict.items() if k.startswith(prefix))
    for key, value in final_norm.items():
        state_dict.setdefault(key, value)
    check_checkpoint_family(state_dict, model, source)
    _check_attention_kind(state_dict, model_state, source, name)

    if hasattr(model, 'la_sr_ratios') and hasattr(model, 'pos_embed1'):
        stored = _infer_pvt_la_sr_ratios(state_dict)
        built = ''.join(str(r) for r in model.la_sr_ratios)
        if stored is not None and 'S' not in getattr(model, 'attn_type', '') and stored != built:
            raise CheckpointMismatchError(
                f"checkpoint {source} was trained with la_sr_ratios='{stored}' but the {name} was "
                f"built with '{built}'; pass la_sr_ratios='{stored}'")

    dropped = []
    kept = OrderedDict()
    classification_only = tuple(getattr(model, 'classification_only_modules', ()))
    for key, value in state_dict.items():
        leaf_module = key.split('.', 1)[0]
        if leaf_module == 'head' or (leaf_module in classification_only and key not in model_state):
            dropped.append(key)
        elif leaf_module == 'norm' and key not in model_state:
            if map_final_norm and f'norm3.{key.split(".", 1)[1]}' in model_state:
                kept[f'norm3.{key.split(".", 1)[1]}'] = value
            else:
                dropped.append(key)
        elif key.rsplit('.', 1)[-1] in _RUNTIME_BUFFERS and key not in model_state:
            dropped.append(key)
        else:
            kept[key] = value

    kept, resized = resize_state_dict(kept, model_state)
    mismatched = [f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(model_state[k].shape)}'
                  for k, v in kept.items() if k in model_state and v.shape != model_state[k].shape]
    for entry in mismatched:
        kept.pop(entry.split(':', 1)[0])

    result = model.load_state_dict(kept, strict=False)
    missing, unexpected = list(result.missing_keys), list(result.unexpected_keys)
    loaded = [k for k in kept if k in model_state]
    report = LoadReport(source=source, origin=origin, prefix=prefix, loaded=loaded, missing=missing,
                        unexpected=unexpected, dropped=dropped, resized=resized, mismatched=mismatched,
                        outside_prefix=outside)

    lines = [f'{name}: loaded {len(loaded)}/{len(model_state)} tensors from {source} ({origin}'
             f"{', prefix ' + repr(prefix) if prefix else ''}); missing {len(missing)}, unexpected "
             f'{len(unexpected)}, dropped {len(dropped)} (head / classification-only modules / '
             f'run-time buffers), resized {len(resized)}, shape-mismatched {len(mismatched)}, outside the '
             f'prefix {len(outside)}']
    for title, keys in (('missing', missing), ('unexpected', unexpected), ('resized', resized),
                        ('shape mismatch', mismatched)):
        if keys:
            lines.append(f'  {title}: {", ".join(keys[:20])}{" ..." if len(keys) > 20 else ""}')
    level = logging.WARNING if (unexpected or mismatched or
                                any('attn.' in k for k in missing)) else logging.INFO
    _log('\n'.join(lines), logger, level)

    if strict and (missing or unexpected or mismatched):
        raise CheckpointMismatchError(
            f'strict load of {source} into {name} failed: missing {missing[:10]}, unexpected '
            f'{unexpected[:10]}, shape mismatch {mismatched[:10]}')
    return report
