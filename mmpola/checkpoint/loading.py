"""Load weights into the backbones, the classifiers and the timm entries: one path (docs/design.md,
"Checkpoints: official names, loading is a filter").

    read safely -> extract -> prefix -> architecture filter -> is it for this model -> resize -> load -> report

Accepted inputs, all read with :func:`mmpola.checkpoint.reading.safe_torch_load` (weights only, no yacs):

* official files ``{'model': state_dict, 'config': CfgNode, ...}`` (PolaFormer, FLatten, InLine),
  ``{'model': ..., 'state_dict_ema': ...}`` (PolaFormer++);
* mmengine / mmdet / mmseg checkpoints ``{'state_dict': ...}`` (detector or segmentor keys
  ``backbone.*``, a classifier's ``backbone.*`` ...);
* bare state dicts, with or without ``module.`` / ``backbone.`` prefixes;
* EMA weights: with ``use_ema=True`` (default, as timm) ``state_dict_ema`` or ``model_ema`` win
  when present.

What happens to the keys:

1. the prefix is found automatically as the one under which most checkpoint keys name a model
   parameter (``''``, ``module.``, ``backbone.``, ``module.backbone.`` ...), or given explicitly;
2. the architecture's filter (``model.checkpoint_filter``, timm's ``checkpoint_filter_fn``) drops
   what the model does not have: the classification modules, run-time buffers
   (``*.attn_mask``, ``*.relative_position_index``), and checks what must agree (PVT's spatial
   reduction);
3. the file is compared with the model's key signature (:mod:`.signatures`): a file of another
   architecture or attention kind is refused, naming what it looks like, and so is a file of other
   blocks (another depth, width or per-stage layout: ``Pola-PVT-S: 3-4-6-3 blocks`` for a
   ``Pola-PVT-T``) unless ``strict=False`` asks for the blocks both have;
4. grids are resized when the pretraining grid differs (:func:`resize_state_dict`);
5. the tensors that load must be finite (:func:`check_finite`: a NaN weight is refused, naming it);
6. ``load_state_dict(strict=False)``, then one log line with counts of loaded / missing /
   unexpected / dropped / resized keys (:class:`LoadReport`).
"""
import logging
import os
from collections import OrderedDict

from .reading import download_checkpoint, safe_torch_load
from .signatures import attention_modules
from .state_dict import CheckpointMismatchError, check_finite, extract_state_dict, find_key_prefix, resize_state_dict

__all__ = ['read_checkpoint', 'load_checkpoint', 'prepare_state_dict', 'LoadReport', 'checkpoint_source',
           'PARTIAL_OPTION']

# how a caller of :func:`load_checkpoint` loads a file of other blocks on purpose (the messages say it)
PARTIAL_OPTION = ("strict=False (init_cfg=dict(type='Pretrained', checkpoint=..., strict=False), or "
                  'load_checkpoint(..., strict=False))')


class LoadReport(dict):
    """What a load did: lists of keys under 'loaded', 'missing', 'unexpected', 'dropped',
    'resized', 'mismatched', 'outside_prefix', plus 'prefix', 'origin' and 'source'. Attribute
    access for convenience; ``missing_keys`` / ``unexpected_keys`` as in torch's ``load_state_dict`` result."""

    __getattr__ = dict.__getitem__

    @property
    def missing_keys(self):
        return self['missing']

    @property
    def unexpected_keys(self):
        return self['unexpected']


def _log(msg, logger, level=logging.INFO):
    if logger is None:
        return
    if isinstance(logger, logging.Logger):
        logger.log(level, msg)
        return
    from mmengine.logging import print_log
    print_log(msg, logger=logger, level=level)


def checkpoint_source(checkpoint):
    """How messages name a checkpoint (their ``source``, a noun): ``"checkpoint 'PATH'"`` (or URL), or 'the given
    state dict'."""
    if isinstance(checkpoint, (str, os.PathLike)):
        return f'checkpoint {os.fspath(checkpoint)!r}'
    return 'the given state dict'


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


class _Prepared(dict):
    """What :func:`prepare_state_dict` made: the tensors to load and what it did to the file's keys."""

    __getattr__ = dict.__getitem__


def prepare_state_dict(model, state_dict, source='the given state dict', prefix=None, map_final_norm=False,
                       strict=None):
    """Steps 1-5 of the loading (module doc) on extracted tensors: prefix, the model's filter, "is this
    file for this model", resizing and the finite check; what :func:`load_checkpoint` loads, and what
    timm's ``pretrained_filter_fn`` of the entries returns.

    Args:
        model: the backbone or classifier; a model with ``checkpoint_filter`` and ``checkpoint_signature``
            brings its filter and key signature (a classifier's signature is its backbone's, compared
            with the keys below its ``checkpoint_signature_prefix``), any other module is loaded by
            matching names. ``partial_load_option`` names how its callers load other blocks on purpose.
        state_dict: the file's tensors (:func:`extract_state_dict`).
        source, prefix, map_final_norm, strict: as :func:`load_checkpoint`.

    Returns:
        a dict with ``state_dict`` (the tensors to load, shape-mismatched ones included), ``prefix``,
        ``matched``, ``outside`` (keys outside the prefix), ``dropped``, ``resized`` and ``mismatched``.
    """
    model_state = model.state_dict()
    name = type(model).__name__
    if prefix is None:
        prefix, matched = find_key_prefix(state_dict, model_state)
    else:
        matched = sum(1 for k in state_dict if k.startswith(prefix) and k[len(prefix):] in model_state)
    outside = [k for k in state_dict if not k.startswith(prefix)]
    final_norm = {}
    if map_final_norm and prefix.endswith('backbone.'):
        # a classifier checkpoint keeps its final norm beside the backbone: '<outer>norm.*'
        outer = prefix[:-len('backbone.')]
        final_norm = {k[len(outer):]: v for k, v in state_dict.items() if k.startswith(outer + 'norm.')}
    state_dict = OrderedDict((k[len(prefix):], v) for k, v in state_dict.items() if k.startswith(prefix))
    for key, value in final_norm.items():
        state_dict.setdefault(key, value)

    dropped = []
    if hasattr(model, 'checkpoint_filter'):
        state_dict, dropped = model.checkpoint_filter(state_dict, source, map_final_norm=map_final_norm)
    signature = model.checkpoint_signature() if hasattr(model, 'checkpoint_signature') else None
    if signature is not None:
        below = getattr(model, 'checkpoint_signature_prefix', '')
        keys = OrderedDict((k[len(below):], v) for k, v in state_dict.items() if k.startswith(below))
        signature.check(keys, source, prefix, layout=strict is not False,
                        partial_option=getattr(model, 'partial_load_option', PARTIAL_OPTION))
    elif matched == 0:
        raise CheckpointMismatchError(
            f'{source} has no key matching {name}{" under prefix " + repr(prefix) if prefix else ""}; '
            f'its keys look like {list(state_dict)[:3]}, the model\'s like {list(model_state)[:3]}')

    kept, resized = resize_state_dict(state_dict, model_state)
    mismatched = [f'{k}: checkpoint {tuple(v.shape)} vs model {tuple(model_state[k].shape)}'
                  for k, v in kept.items() if k in model_state and v.shape != model_state[k].shape]
    shapes_differ = {entry.split(':', 1)[0] for entry in mismatched}
    check_finite({k: v for k, v in kept.items() if k in model_state and k not in shapes_differ}, source)
    return _Prepared(state_dict=kept, prefix=prefix, matched=matched, outside=outside, dropped=dropped,
                     resized=resized, mismatched=mismatched)


def load_checkpoint(model, checkpoint, prefix=None, use_ema=True, map_final_norm=False, strict=None,
                    map_location='cpu', logger='current'):
    """Load a checkpoint into a backbone (or any module) by filtering keys.

    Args:
        model: the backbone or classifier; a :class:`~mmpola.models.backbones.DenseBackbone` or an
            :class:`~mmpola.models.classifier.ImageClassifier` brings its filter and key signature
            (:func:`prepare_state_dict`), any other module is loaded by matching names.
        checkpoint: path, URL or already loaded dict (any container listed in the module doc).
        prefix: keep only keys starting with it and strip it (e.g. ``'backbone.'``); None finds it.
        use_ema: prefer ``state_dict_ema`` / ``model_ema`` when present.
        map_final_norm: copy the classification ``norm.*`` into the last output norm
            (``norm3.*``) when the model has it (Swin: the trained LN after stage 4). Off by
            default, like mmdet.
        strict: None (default): the file must have the model's blocks (depth, widths and per-stage
            attention), while keys the file need not have (output norms) may be missing and keys the
            model does not use (a detector's neck and heads) unused; True: also raise if any model key
            is missing or any checkpoint key is left unused; False: load whatever fits, also from a
            file of other blocks (the first blocks of each stage of a deeper model ...), on purpose.
        map_location: device for reading.
        logger: mmengine logger name, a ``logging.Logger``, or None for silence.

    Returns:
        :class:`LoadReport`.

    Raises:
        CheckpointMismatchError: the file is not for this model (another architecture or attention
            kind, nothing matches; unless ``strict=False``: other blocks), the architecture's filter
            refuses it (PVT: other ``la_sr_ratios``), or (strict) any missing/unexpected key.
        NonFiniteCheckpointError: a tensor that would load holds NaN or infinite values.
    """
    source = checkpoint_source(checkpoint)
    state_dict, origin = extract_state_dict(read_checkpoint(checkpoint, map_location), use_ema)
    model_state = model.state_dict()
    name = type(model).__name__
    prepared = prepare_state_dict(model, state_dict, source, prefix, map_final_norm, strict)
    kept, prefix, outside = prepared.state_dict, prepared.prefix, prepared.outside
    dropped, resized, mismatched = prepared.dropped, prepared.resized, prepared.mismatched
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
    level = logging.WARNING if (unexpected or mismatched or any(attention_modules([k]) for k in missing)) \
        else logging.INFO
    _log('\n'.join(lines), logger, level)

    if strict and (missing or unexpected or mismatched):
        raise CheckpointMismatchError(
            f'strict load of {source} into {name} failed: missing {missing[:10]}, unexpected '
            f'{unexpected[:10]}, shape mismatch {mismatched[:10]}')
    return report

