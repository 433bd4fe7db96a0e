"""mmdet's ``DetInferencer`` and mmseg's ``MMSegInferencer`` for image folders: every image predicted,
every file left out named.

Given a folder, mmdet lists it by lower-case suffix (``b.JPG`` is skipped without a word), mmseg takes
every file, and one file that cannot be decoded stops the whole folder (``AssertionError: failed to
load image``).
:class:`DetInferencer` and :class:`SegInferencer` are the two libraries' classes with their
``_inputs_to_list`` (the step that turns the input into the list of images, which subclasses may
override) extended by :func:`image_inputs`: a folder's image files are taken whatever the case of the
suffix (sorted by name), files that are no image or cannot be decoded are left out with one warning
naming each and why, and the rest is predicted; nothing left is an error. Given paths (one or a list, whose
results are in their order), a path that does not exist or cannot be decoded is an error naming it, as
nothing may be left out of a list. Everything else is the
libraries' own. They are exported where an OpenMMLab user looks for inferencers, the package's
``apis`` (as ``mmdet.apis`` / ``mmseg.apis``), and from the package itself::

    from mmpola.apis import DetInferencer          # or: from mmpola import DetInferencer
    result = DetInferencer(model=CONFIG, weights=CHECKPOINT)('photos/', out_dir='outputs')

Every image file is decoded once more before the run to find the unreadable ones (mmcv's
``imfrombytes``, as the inferencers' loader); a JPEG whose body is damaged (libjpeg's corruption
warning during that decode, :mod:`mmpola.datasets.decoding`) is left out too.
"""
import os
import os.path as osp

from mmengine.logging import print_log

from mmpola.errors import UserError

__all__ = ['DetInferencer', 'SegInferencer', 'check_output_names', 'image_inputs']  # noqa: F822 (made on first use)

# how many skipped files the warning names
_SHOWN = 10


def _unreadable(path):
    """Why the inferencers' loader could not decode ``path`` (mmcv's ``imfrombytes``), or None."""
    import mmcv

    from mmpola.datasets.decoding import corrupt_jpeg_messages, decoder_messages
    try:
        with open(path, 'rb') as f:
            data = f.read()
        if not data:
            return 'empty file'
        with decoder_messages() as lines:
            image = mmcv.imfrombytes(data)
    except Exception as e:  # unreadable file or decoder error: the file is left out, the reason shown
        return f'cannot be read: {type(e).__name__}: {e}'
    if image is None:
        return 'cannot be decoded as an image'
    corrupt = corrupt_jpeg_messages(lines)
    return f'damaged: its JPEG data are corrupt (libjpeg: {"; ".join(corrupt)})' if corrupt else None


def image_inputs(inputs, suffixes, who='inferencer'):
    """The list of inputs to predict for ``inputs`` (a folder, a path, an array or a list of them).

    A folder gives its files whose suffix is one of ``suffixes`` in any case (``.JPG`` too), sorted by
    name; local files that cannot be decoded are left out. A warning names every file left out (no
    image suffix, empty, undecodable) and says how many are predicted; :class:`UserError` when none is.
    A path or a list of them, whose results follow the order of the inputs, leaves nothing out:
    :class:`UserError` naming each path that does not exist or cannot be decoded.
    Arrays, URLs and other inputs are passed on as they are.
    """
    folder = inputs if isinstance(inputs, str) and osp.isdir(inputs) else None
    if folder is not None:
        candidates = [osp.join(folder, name) for name in sorted(os.listdir(folder))
                      if osp.isfile(osp.join(folder, name))]
    else:
        candidates = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    suffixes = tuple(s.lower() for s in suffixes)
    kept, skipped, missing = [], [], []
    for item in candidates:
        if isinstance(item, str) and folder is None and '://' not in item and not osp.exists(item):
            missing.append(item)
            continue
        if not isinstance(item, str) or not osp.isfile(item):
            kept.append(item)
            continue
        reason = ('not an image file name (suffixes: ' + ' '.join(suffixes) + ')'
                  if folder is not None and not item.lower().endswith(suffixes) else _unreadable(item))
        if reason:
            skipped.append(f'{osp.basename(item) if folder else item} ({reason})')
        else:
            kept.append(item)
    where = f'folder {folder!r}' if folder is not None else 'the inputs'
    if folder is None and (missing or skipped):  # a given list: each result must stay at its input's place
        problems = [f'{path} (does not exist)' for path in missing] + skipped
        raise UserError(f'{who}: {len(problems)} of the {len(candidates)} given file(s) cannot be predicted: '
                        f'{"; ".join(problems[:_SHOWN])}{"; ..." if len(problems) > _SHOWN else ""}. Fix: correct or '
                        'remove them (the results follow the order of the inputs), or give their folder, whose '
                        'unreadable files are left out with a warning')
    if not kept:
        raise UserError(f'{who}: no image to predict in {where}'
                        + (f': {"; ".join(skipped[:_SHOWN])}' if skipped else ' (it is empty)')
                        + '. Fix: give a folder or files of images ' + ', '.join(suffixes))
    if skipped:
        more = f'; and {len(skipped) - _SHOWN} more' if len(skipped) > _SHOWN else ''
        print_log(f'[mmpola] {who}: {len(skipped)} of {len(candidates)} files of {where} left out: '
                  f'{"; ".join(skipped[:_SHOWN])}{more}. Predicting the other {len(kept)}',
                  logger='current', level=30)
    return kept


def check_output_names(inputs, who='inferencer'):
    """:class:`UserError` when two image paths of ``inputs`` have one name without their suffix: the inferencers
    save each image's drawing and prediction under it (``out_dir``), so the second would overwrite the first."""
    seen, clashes = {}, []
    for item in inputs:
        if isinstance(item, str):
            stem = osp.splitext(osp.basename(item))[0]
            if stem in seen:
                clashes.append(f'{seen[stem]} and {item}')
            else:
                seen[stem] = item
    if clashes:
        raise UserError(f'{who}: {len(clashes)} pair(s) of inputs share a file name ({"; ".join(clashes[:_SHOWN])}), '
                        'under which out_dir keeps their drawings and predictions: the second would overwrite the '
                        'first. Fix: predict them in separate calls with separate out_dir, or rename them')


def _with_image_inputs(base, suffixes, name):
    class Inferencer(base):
        __doc__ = f"""mmpola's extension of ``{base.__module__}.{base.__name__}`` for image folders
        (:mod:`mmpola.inferencers`); same arguments and results."""

        def __init__(self, *args, **kwargs):
            weights = kwargs.get('weights', args[1] if len(args) > 1 else None)
            from mmpola.checkpoint import checkpoint_source
            self._weights_name = checkpoint_source(weights) if isinstance(weights, str) else 'the weights'
            super().__init__(*args, **kwargs)

        def _load_weights_to_model(self, model, checkpoint, cfg):
            if checkpoint is not None:  # before the library takes the file's class names
                from mmpola.runtime.fit_check import check_inference_weights
                check_inference_weights(model, checkpoint, self._weights_name)
            super()._load_weights_to_model(model, checkpoint, cfg)

        def __call__(self, inputs, *args, **kwargs):
            self._saving = bool(kwargs.get('out_dir'))
            return super().__call__(inputs, *args, **kwargs)

        def _inputs_to_list(self, inputs):
            listed = image_inputs(inputs, suffixes, name)
            if getattr(self, '_saving', False):
                check_output_names(listed, name)
            return listed

        if hasattr(base, 'pred2dict'):  # mmdet's: an array's sample has img_path None, which it cannot name
            def pred2dict(self, data_sample, pred_out_dir=''):
                if 'img_path' in data_sample and data_sample.img_path is None:
                    del data_sample.img_path  # mmdet then numbers the file, as for its visualisations
                return base.pred2dict(self, data_sample, pred_out_dir)

    Inferencer.__name__ = Inferencer.__qualname__ = name
    return Inferencer


_CLASSES = {}


def __getattr__(name):
    """The classes are made on first use, so that importing this module needs neither library."""
    if name not in ('DetInferencer', 'SegInferencer'):
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    if name not in _CLASSES:
        # torchvision's image suffixes: mmdet's folder listing uses the same (mmseg's takes every file)
        from torchvision.datasets.folder import IMG_EXTENSIONS
        if name == 'DetInferencer':
            from mmdet.apis import DetInferencer as base
        else:
            from mmseg.apis import MMSegInferencer as base
        _CLASSES[name] = _with_image_inputs(base, IMG_EXTENSIONS, name)
    return _CLASSES[name]
