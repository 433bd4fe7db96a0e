"""Pre-flight checks: what a run will read and build, checked before anything is built.

Mistakes that would otherwise surface hours into a run (or never) stop it at once, with one message
naming the file or config entry, the problem and the fix. tools/train.py, tools/test.py and the demos
call :func:`run_preflight`; with a process group only rank 0 checks and every rank gets its verdict.

One module per kind of check:

* :mod:`.checkpoints`: the checkpoint files the run reads (``load_from``, ``--resume``, the test
  checkpoint, pretrained inits): present, complete, loadable weights-only;
* :mod:`.files`: the data files exist and are not empty;
* :mod:`.coco`: COCO annotation files (no annotations, ids used twice, unusable annotations, only
  crowd regions, boxes off their polygons, image sizes against the images, classes vs categories, a
  metric's file against the dataset's);
* :mod:`.class_folders`: classification splits in class folders numbered from one class list, no
  class folder without images;
* :mod:`.seg_maps`: segmentation maps against their images and the ``reduce_zero_label`` convention;
* :mod:`.image_headers`: size, channels and EXIF orientation of an image file, from its header
  (shared by the two above);
* :mod:`.model`: ``num_classes`` of the heads against the data, ``in_channels`` of the necks and
  heads against the backbone;
* :mod:`.datasets`: what a dataset config reads (shared by the others).
"""
import os.path as osp

from ..config import is_url
from ..launch import run_on_rank0_and_share
from .checkpoints import check_run_checkpoints
from .class_folders import check_class_folders, is_class_folder_dataset
from .coco import check_metric_file, checked_coco_categories, is_evaluated, uses_masks
from .datasets import (
    coco_ann_path,
    coco_image_dir,
    dataset_classes,
    init_default,
    is_coco,
    is_seg,
    leaf_dataset_paths,
    pipeline_step,
    reads_local_files,
    seg_dataset_files,
)
from .files import check_data_files
from .image_headers import IMAGE_LOADERS, applies_orientation
from .model import check_model_channels, check_num_classes
from .seg_maps import check_seg_maps, check_zero_label_setting

__all__ = ['run_preflight', 'check_dataset_contents']


def run_preflight(cfg, dataloader_keys, skip_data_check=False, training=False):
    """Everything the tools check before building anything, once.

    * the model's channels (:func:`.model.check_model_channels`) and the checkpoint files the run
      reads (:func:`.checkpoints.check_run_checkpoints`; pretrained inits only when ``training``),
      always;
    * unless ``skip_data_check`` (``--skip-data-check``): the data files of ``dataloader_keys``
      (:func:`.files.check_data_files`) and what they hold against the model
      (:func:`check_dataset_contents`).

    With a process group (started by :func:`mmpola.runtime.launch.init_distributed`) only rank 0
    checks; the others wait for its verdict and stop with the same message
    (:func:`mmpola.runtime.launch.run_on_rank0_and_share`).
    """
    def checks():
        check_model_channels(cfg)
        check_run_checkpoints(cfg, training)
        if not skip_data_check:
            check_data_files(cfg, dataloader_keys)
            check_dataset_contents(cfg, dataloader_keys)

    run_on_rank0_and_share(checks)


def check_dataset_contents(cfg, dataloader_keys):
    """The content checks of every (leaf) dataset of ``dataloader_keys``: COCO annotations and image
    sizes, class names against the file's categories, the class folders of classification splits,
    segmentation maps and their label convention,
    and ``num_classes`` of the heads. Each annotation file is parsed at most once (and not again
    while it is unchanged)."""
    categories = {}
    for key in dataloader_keys:
        loader = cfg.get(key)
        if not isinstance(loader, dict):
            continue
        for where, dataset in leaf_dataset_paths(loader.get('dataset'), f'{key}.dataset'):
            if not reads_local_files(dataset):
                continue
            if is_coco(dataset):
                path = coco_ann_path(dataset)
                if not path or not osp.isfile(path):
                    continue
                masks = uses_masks(cfg, key, dataset)
                metric_files = is_evaluated(cfg, key)
                index, _ = pipeline_step(dataset, IMAGE_LOADERS)
                scored = any(f is None or (isinstance(f, str) and osp.abspath(f) == osp.abspath(path))
                             for f in metric_files or [])  # a metric without a file of its own uses the dataset's
                settings = dict(img_dir=coco_image_dir(dataset), applies_orientation=applies_orientation(
                    dataset.get('pipeline')), evaluated=scored,
                    load_option=None if index is None else f'{where}.pipeline.{index}')
                if (path, masks, scored) not in categories:
                    categories[path, masks, scored] = checked_coco_categories(path, key, masks, **settings)
                categories[path] = categories[path, masks, scored]
                for metric_file in metric_files or []:  # a metric's own file: the ground truth it scores against
                    if metric_file and not is_url(metric_file) and osp.isfile(metric_file) \
                            and osp.abspath(metric_file) != osp.abspath(path):
                        metric_key = key.replace('_dataloader', '_evaluator')
                        checked_coco_categories(metric_file, metric_key, masks, evaluated=True)
                        check_metric_file(metric_file, path, metric_key, key)
            elif is_class_folder_dataset(dataset):
                check_class_folders(cfg, key, where, dataset)
            elif is_seg(dataset):
                root = dataset.get('data_root') or ''
                images, seg_maps = seg_dataset_files(dataset, root)
                if seg_maps:
                    reduce_zero_label, fix = _zero_label_setting(key, where, dataset)
                    check_seg_maps(images, seg_maps, key, root, reduce_zero_label, dataset_classes(dataset)[0], fix)
    check_num_classes(cfg, dataloader_keys, categories)


def _zero_label_setting(key, where, dataset):
    """The dataset's ``reduce_zero_label`` (checked against its ``LoadAnnotations``), and the options
    that would turn it off."""
    setting = dataset.get('reduce_zero_label')
    if setting is None:
        setting = init_default(dataset.get('type'), 'reduce_zero_label', False)
    index, step = pipeline_step(dataset, 'LoadAnnotations')
    step_where = f'{where}.pipeline.{index}'
    check_zero_label_setting(key, setting, step, step_where)
    options = f'{where}.reduce_zero_label=False'
    if step is not None and step.get('reduce_zero_label') is not None:
        options += f' {step_where}.reduce_zero_label=False'
    fix = (f'--cfg-options {options} (and the same for the other dataloaders of these maps). If the maps are '
           'right as they are (0 = unlabelled, classes 1..N), this check can be skipped with --skip-data-check')
    return setting, fix
