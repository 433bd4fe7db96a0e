"""Pre-flight checks: what a run will read and build, checked before anything is built.

Mistakes that would otherwise surface hours into a run (or never) stop it at once, with one message
naming the file or config entry, the problem and the fix. tools/train.py, tools/test.py and the demos
call :func:`run_preflight`; with a process group only rank 0 checks and every rank gets its verdict.

One module per kind of check:

* :mod:`.checkpoints`: the checkpoint files the run reads (``load_from``, ``--resume``, the test
  checkpoint, pretrained inits): present, complete, loadable weights-only;
* :mod:`.files`: the data files exist and are not empty;
* :mod:`.coco`: COCO annotation files (unusable annotations, classes vs categories);
* :mod:`.seg_maps`: segmentation maps against their images;
* :mod:`.model`: ``num_classes`` of the heads against the data, ``in_channels`` of the necks and
  heads against the backbone;
* :mod:`.datasets`: what a dataset config reads (shared by the others).
"""
import os.path as osp

from ..launch import run_on_rank0_and_share
from .checkpoints import check_run_checkpoints
from .coco import checked_coco_categories, uses_masks
from .datasets import coco_ann_path, is_coco, is_seg, leaf_datasets, reads_local_files, seg_dataset_files
from .files import check_data_files
from .model import check_model_channels, check_num_classes
from .seg_maps import check_seg_maps

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
    """The content checks of every (leaf) dataset of ``dataloader_keys``: COCO annotations, class
    names against the file's categories, segmentation maps, and ``num_classes`` of the heads.
    Each annotation file is parsed at most once (and not again while it is unchanged)."""
    categories = {}
    for key in dataloader_keys:
        loader = cfg.get(key)
        if not isinstance(loader, dict):
            continue
        for dataset in leaf_datasets(loader.get('dataset')):
            if not reads_local_files(dataset):
                continue
            if is_coco(dataset):
                path = coco_ann_path(dataset)
                if not path or not osp.isfile(path):
                    continue
                masks = uses_masks(cfg, key, dataset)
                if (path, masks) not in categories:
                    categories[path, masks] = checked_coco_categories(path, key, masks)
                categories[path] = categories[path, masks]
            elif is_seg(dataset):
                root = dataset.get('data_root') or ''
                images, seg_maps = seg_dataset_files(dataset, root)
                if seg_maps:
                    check_seg_maps(images, seg_maps, key, root)
    check_num_classes(cfg, dataloader_keys, categories)
