"""The model config against itself and its data: classes of the heads, channels of the necks.

* :func:`check_num_classes`: ``num_classes`` of every head against the classes of every dataset
  (and, for COCO files, the classes against the file's ``categories``);
* :func:`check_model_channels`: necks' / decode heads' ``in_channels`` against the backbone's
  ``out_channels`` (the backbone is built on the ``meta`` device: no memory, no weights); a simple
  feature pyramid (ViTDet's, for a plain ViT) reads only the last map: its ``backbone_channel``.
"""
from mmpola.errors import UserError

from .class_folders import class_folder_classes, is_class_folder_dataset
from .coco import check_classes_in_file, class_list
from .datasets import coco_ann_path, dataset_classes, is_coco, leaf_datasets

__all__ = ['check_num_classes', 'head_num_classes', 'check_model_channels']

# parts of a model config whose num_classes is not the dataset's (RPN is class-agnostic)
_NOT_DATASET_CLASSES = ('rpn_head', 'train_cfg', 'test_cfg', 'data_preprocessor')


def head_num_classes(model_cfg, where='model'):
    """``[(config path, num_classes)]`` of every head of a model config that predicts the dataset's
    classes (RPN heads, train/test settings and data preprocessors are left out)."""
    found = []
    if isinstance(model_cfg, dict):
        for key, value in model_cfg.items():
            if key in _NOT_DATASET_CLASSES:
                continue
            if key == 'num_classes' and isinstance(value, int) and not isinstance(value, bool):
                found.append((f'{where}.num_classes', value))
            else:
                found += head_num_classes(value, f'{where}.{key}')
    elif isinstance(model_cfg, (list, tuple)):
        for i, value in enumerate(model_cfg):
            found += head_num_classes(value, f'{where}.{i}')
    return found


def check_num_classes(cfg, dataloader_keys, coco_categories=None):
    """Every head's ``num_classes`` must equal the number of classes of every dataset it trains or
    is evaluated on; for COCO files, every class must also be one of the file's categories.

    Today a Mask R-CNN with 80 classes on a 3-class set trains an epoch and crashes in the metric,
    and a RetinaNet with 2 on a 3-class set learns the third class as background, exit status 0.
    ``coco_categories`` maps annotation paths to their category names (to read each file once).
    """
    heads = head_num_classes(cfg.get('model') or {})
    if 'train_dataloader' in dataloader_keys:
        heads += _mixup_width(cfg, heads)
    for key in dataloader_keys:
        loader = cfg.get(key)
        if not isinstance(loader, dict):
            continue
        for dataset in leaf_datasets(loader.get('dataset')):
            classes, source = dataset_classes(dataset)
            folders = classes is None and is_class_folder_dataset(dataset)
            if folders:  # numbered from class folders: a wider head only predicts classes no label has
                classes, source = class_folder_classes(dataset)
            if classes is None:
                continue
            names = (coco_categories or {}).get(coco_ann_path(dataset)) if is_coco(dataset) else None
            if names is not None:
                check_classes_in_file(key, dataset, classes, source, names)
            wrong = [(path, n) for path, n in heads if n < len(classes) or (n != len(classes) and not folders)]
            if wrong:
                listed = ', '.join(f'{path}={n}' for path, n in wrong)
                fix = ' '.join(f'{path}={len(classes)}' for path, _ in wrong)
                raise UserError(
                    f'{key}: the dataset has {len(classes)} classes {class_list(classes)} (from {source}) but '
                    f'the model predicts another number: {listed}. Too many classes break the evaluation after '
                    'training; too few train the remaining classes as background (or fail on their labels). '
                    f'Fix: set num_classes={len(classes)} in every head, e.g. --cfg-options {fix}'
                    + (f", or give the dataset its classes: metainfo=dict(classes=(...)) in {key}.dataset"
                       if 'METAINFO' in source else ''))


def _mixup_width(cfg, heads):
    """``[('data_preprocessor.mixup.num_classes', n)]`` when the training's Mixup / CutMix targets (one-hot, ``n``
    wide) are set, after checking that they are as wide as the logits of the heads (else the loss fails at the
    first step on tensors of two sizes)."""
    mixup = (cfg.get('data_preprocessor') or {}).get('mixup') or {}
    width = mixup.get('num_classes') if isinstance(mixup, dict) else None
    if not isinstance(width, int) or isinstance(width, bool):
        return []
    other = [(path, n) for path, n in heads if n != width]
    if other:
        listed = ', '.join(f'{path}={n}' for path, n in other)
        raise UserError(f'data_preprocessor.mixup.num_classes={width} differs from {listed}: the Mixup / CutMix '
                        'targets would not fit the logits and the loss would fail at the first step. Fix: set both '
                        f'to the number of classes, e.g. --cfg-options {other[0][0]}=N '
                        'data_preprocessor.mixup.num_classes=N')
    return [('data_preprocessor.mixup.num_classes', width)]


def _backbone_out_channels(backbone_cfg):
    """``out_channels`` of the backbone a config builds (on the meta device: nothing allocated),
    or None when it cannot be built here or does not say."""
    import torch
    from mmengine.registry import MODELS
    try:
        with torch.device('meta'), MODELS.switch_scope_and_registry(None) as registry:
            backbone = registry.build(backbone_cfg)
        channels = getattr(backbone, 'out_channels', None)
    except Exception:  # any problem building it is the Runner's to report (with its own message)
        return None
    if isinstance(channels, int):
        return [channels]
    if isinstance(channels, (list, tuple)) and all(isinstance(c, int) for c in channels):
        return list(channels)
    return None


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def check_model_channels(cfg):
    """A neck's (or, without a neck, each decode / auxiliary head's) ``in_channels`` must be the
    channels the backbone returns; today a mismatch is a bare AssertionError at the first forward."""
    model = cfg.get('model') or {}
    while isinstance(model, dict) and 'backbone' not in model and isinstance(model.get('module'), dict):
        model = model['module']  # test-time augmentation wrapper
    if not isinstance(model, dict) or not isinstance(model.get('backbone'), dict):
        return
    consumers = []
    neck = model.get('neck')
    for i, item in enumerate(_as_list(neck)[:1] if neck else []):  # the first neck reads the backbone
        where = 'model.neck' if not isinstance(neck, (list, tuple)) else f'model.neck.{i}'
        if isinstance(item, dict) and 'backbone_channel' in item:  # a simple pyramid of the last map
            consumers.append((f'{where}.backbone_channel', item['backbone_channel'], -1))
        elif isinstance(item, dict) and 'in_channels' in item:
            consumers.append((f'{where}.in_channels', item['in_channels'], None))
    if not neck:
        for name in ('decode_head', 'auxiliary_head'):
            heads = model.get(name)
            for i, head in enumerate(_as_list(heads) if heads else []):
                if isinstance(head, dict) and 'in_channels' in head:
                    where = f'model.{name}' if not isinstance(heads, (list, tuple)) else f'model.{name}.{i}'
                    consumers.append((f'{where}.in_channels', head['in_channels'], head.get('in_index', -1)))
    if not consumers:
        return
    out = _backbone_out_channels(model['backbone'])
    if out is None:
        return
    backbone = f"model.backbone ({model['backbone'].get('type')}, out_indices " \
               f"{tuple(model['backbone'].get('out_indices', range(len(out))))})"
    for key, given, in_index in consumers:
        if in_index is None:
            expected = out
        else:
            try:
                expected = [out[i] for i in _as_list(in_index)]
            except IndexError:
                where = key.rsplit('.', 1)[0]
                raise UserError(f'{where}.in_index={in_index!r} selects a backbone output that does not exist: '
                                f'{backbone} returns {len(out)} maps') from None
            if not isinstance(in_index, (list, tuple)):
                expected = expected[0]
        if _as_list(given) != _as_list(expected):
            raise UserError(
                f'{key}={given!r} does not match the channels of the maps {backbone} returns'
                f'{"" if in_index is None else f" at in_index {in_index!r}"}: {expected!r}. '
                f'Fix: --cfg-options {key}={str(expected).replace(" ", "")}')
