"""Image classification data in class folders (``<split>/<class>/<image>``, mmpola's
``ImageNetFolderDataset``): every split numbered from one list of classes.

The class list comes from one place: ``metainfo.classes``, else the class folders of
``classes_from`` (the shipped configs: the training split), else the split's own folders. A split
numbered from its own folders that lacks one class folder shifts every label after it by one (the
accuracy is then computed against wrong labels, without a word); a class folder without images
(an interrupted copy) is a class the model never sees. Both are named here, before anything is built.
Folders are listed as the dataset lists them (torchvision's ``find_classes`` and ``make_dataset``). Each
image file is then checked as the detection and segmentation images are
(:func:`mmpola.runtime.preflight.files.check_image_files`: one ``stat`` and one open with two small reads
per file): a file that does not exist (a link whose target is gone), is empty, cannot be read (permission
denied), is no image or is cut off is named with the fix, instead of PIL's error naming no file in a
DataLoader worker.
"""
import os
import os.path as osp

from mmpola.errors import UserError

from .datasets import dataset_class, full_path, shown
from .files import check_image_files

__all__ = ['is_class_folder_dataset', 'check_class_folders', 'class_folder_classes']


def is_class_folder_dataset(dataset):
    cls = dataset_class(dataset.get('type'))
    names = [c.__name__ for c in cls.__mro__] if cls is not None else [str(dataset.get('type')).split('.')[-1]]
    return 'ImageNetFolderDataset' in names


def _class_folders(folder):
    from torchvision.datasets.folder import find_classes
    try:
        return find_classes(folder)[0]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _has_image(folder, extensions):
    """Whether ``folder`` (or a folder below it) holds a file with one of ``extensions``; stops at the first."""
    for root, _, files in os.walk(folder, followlinks=True):
        if any(name.lower().endswith(extensions) for name in files):
            return True
    return False


def _numbering(dataset):
    """``(classes, where they come from, folder that numbers them or None)`` of a dataset config."""
    root = dataset.get('data_root') or ''
    metainfo = dataset.get('metainfo') or {}
    if isinstance(metainfo, dict) and metainfo.get('classes'):
        return list(metainfo['classes']), 'metainfo.classes', None
    split = _split_folder(dataset)
    source = dataset.get('classes_from')
    folder = full_path(root, source) if source else split
    return _class_folders(folder), f'the class folders of {folder!r}', folder


def class_folder_classes(dataset):
    """``(classes, where they come from)`` of a class-folder dataset config, as it numbers them; ``(None, '')``
    when its folders are not there (the file checks name that)."""
    classes, source, _ = _numbering(dataset)
    return (tuple(classes), source) if classes else (None, '')


def _check_source(key, where, dataset):
    """``classes_from`` must be a folder of class folders."""
    source = dataset.get('classes_from')
    metainfo = dataset.get('metainfo') or {}
    if isinstance(metainfo, dict) and metainfo.get('classes'):
        return  # the dataset numbers from metainfo.classes
    folder = full_path(dataset.get('data_root') or '', source) if source else None
    if folder and not _class_folders(folder):
        state = 'does not exist' if not osp.exists(folder) else 'has no class folders'
        raise UserError(
            f'{key}: {where}.classes_from {folder!r} {state}: the class list (and the label of every image) '
            "comes from the training split's class folders. Fix: put the training split there, or give the "
            f'classes: --cfg-options {where}.metainfo.classes=[...] (or, when this split has every class folder, '
            f'{where}.classes_from=None)')


def _split_folder(dataset):
    prefix = dataset.get('data_prefix') or {}
    img_path = prefix.get('img_path', '') if isinstance(prefix, dict) else ''
    return full_path(dataset.get('data_root') or '', img_path or '')


def check_class_folders(cfg, key, where, dataset):
    """One split (``dataset``, found at ``where`` of loader ``key``) against the class list of the
    training split: the same classes in the same order, its class folders all in that list, none of
    them without images."""
    from torchvision.datasets.folder import IMG_EXTENSIONS
    split = _split_folder(dataset)
    if not osp.isdir(split):
        return  # reported by the file checks
    _check_source(key, where, dataset)
    classes, source, numbered_by = _numbering(dataset)
    own = _class_folders(split)
    if not own:
        extensions = tuple(e.lower() for e in dataset.get('extensions') or IMG_EXTENSIONS)
        flat = sum(1 for n in os.listdir(split) if n.lower().endswith(extensions))
        held = f'{flat} image(s) lie in the folder itself' if flat else 'it holds no folder'
        raise UserError(
            f'{key}: {split!r} has no class folders ({held}): classification data are read as '
            "<split>/<class>/<image>, each image's label from its folder. Fix: move each image into the folder of its "
            "class (ImageNet's validation archive is flat: its devkit's ground truth gives the classes; docs/data.md)")
    reference = None
    train = cfg.get('train_dataloader')
    if not key.startswith('train') and isinstance(train, dict) and isinstance(train.get('dataset'), dict) \
            and is_class_folder_dataset(train['dataset']):
        reference = _numbering(train['dataset'])
        if not reference[0]:
            reference = None
    if reference is not None and classes != reference[0]:
        missing = [c for c in reference[0] if c not in classes]
        what = (f'{split!r} lacks the class folder(s) {shown(repr(c) for c in missing)} of the training split'
                if missing and numbered_by == split else
                f'its classes ({len(classes)}, from {source}) are not those of the training data '
                f'({len(reference[0])}, from {reference[1]})')
        train_folder = reference[2]
        fix = (f'number every split from the training split: --cfg-options {where}.classes_from='
               f'{osp.relpath(train_folder, dataset.get("data_root")) if dataset.get("data_root") else train_folder}'
               if train_folder else f'give {where} the training classes: metainfo=dict(classes=...)')
        raise UserError(
            f'{key}: {what}, so its labels would be numbered differently from the model\'s classes (every label '
            f'after a missing class shifted by one) and the accuracy computed against wrong labels. Fix: {fix}')
    absent = [c for c in classes if c not in own] if key.startswith('train') and numbered_by is None else []
    if absent:  # numbered from metainfo.classes: a class without a training folder is never trained
        raise UserError(
            f'{key}: {split!r} has no class folder for {shown(repr(c) for c in absent)} of {source}, a class the '
            'model would never be trained on. Fix: add its folder of images (an interrupted copy?), or leave it out '
            'of metainfo.classes (one class fewer: num_classes too)')
    unknown = [c for c in own if c not in classes]
    if unknown:
        raise UserError(
            f'{key}: {split!r} has class folder(s) that are not classes of the model ({source}): '
            f'{shown(repr(c) for c in unknown)}. Fix: remove or rename those folders (or train with these classes)')
    extensions = tuple(e.lower() for e in dataset.get('extensions') or IMG_EXTENSIONS)
    empty = [c for c in own if not _has_image(osp.join(split, c), extensions)]
    if empty:
        raise UserError(
            f'{key}: {len(empty)} class folder(s) of {split!r} hold no image ({", ".join(extensions)}): '
            f'{shown(repr(c) for c in empty)}, a class the model would '
            f'{"never be trained on" if key.startswith("train") else "never be tested on"}. Fix: copy its images '
            'there (an interrupted copy?), or remove the folder'
            + (' (one class fewer: num_classes too)' if key.startswith('train') or numbered_by == split else ''))
    from torchvision.datasets.folder import make_dataset
    samples = make_dataset(split, {c: i for i, c in enumerate(own)}, extensions=extensions, allow_empty=True)
    check_image_files([('images', [path for path, _ in samples], f'in the class folders of {split!r}',
                        'restore them (a link whose target is gone?), or remove them')],
                      key, drop=', or remove them from the class folders')
