#!/usr/bin/env python3
"""Segmentation demo: train UperNet + Pola-Swin-T on a generated ADE20K-style dataset for a few
CPU minutes and show that it learns.

    python tools/demo_segmentation.py

1. generates data/demo_ade (tools/make_demo_ade.py) unless it is already there;
2. evaluates the untrained model (mmseg's IoUMetric: mIoU over the 8 classes, label 0 ignored);
3. trains (configs/demo/upernet_pola-swin-t_demo-ade-128x128.py; progress every 10 iterations);
4. evaluates again, prints both results and the wall time, and saves
   work_dirs/demo_segmentation/predictions.png (image | ground truth | untrained | trained
   prediction, per validation image) and summary.json;
5. exits 1 with one line when the default run (no --iters) did not learn (trained mIoU under
   ``LEARNED``'s).

The backbone starts from checkpoints/pola_swin_tiny.pth when that file exists, else from random
initialisation. Everything runs in this process, on the CPU (or the first GPU when there is one).
"""
import argparse
import os
import os.path as osp
import sys
import time

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
import _mmpola_tools  # noqa: E402,F401  (first: environment defaults before torch, repo on sys.path)
import cv2  # noqa: E402
import numpy as np  # noqa: E402
from _mmpola_tools import REPO_ROOT  # noqa: E402

import mmpola  # noqa: E402,F401  (backbones, safe checkpoint loading)
from mmpola.datasets.demo_ade import demo_ade_is_complete, make_demo_ade  # noqa: E402
from mmpola.runtime import cli, config, demo  # noqa: E402
from mmpola.runtime.allocator import tune_malloc  # noqa: E402

DEFAULT_CONFIG = osp.join(REPO_ROOT, 'configs', 'demo', 'upernet_pola-swin-t_demo-ade-128x128.py')
PRETRAINED = osp.join('checkpoints', 'pola_swin_tiny.pth')
REPORTED = (('mIoU', 'mIoU'), ('mAcc', 'mAcc'), ('aAcc', 'aAcc'))
# The pass/fail check of the default run (demo.check_learned): trained mIoU in %. Measured 84.4 - 89.1 on one CPU
# with its AVX2 and its generic kernels, 1 and 2 threads (docs/recipes.md); the untrained model 2.43.
LEARNED = {'mIoU': 50.0}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='UperNet + Pola-Swin-T segmentation demo (CPU friendly)')
    parser.add_argument('--config', default=DEFAULT_CONFIG)
    parser.add_argument('--work-dir', default='work_dirs/demo_segmentation')
    parser.add_argument('--data-root', default='data/demo_ade')
    parser.add_argument('--num-train', type=int, default=200, help='images generated for training')
    parser.add_argument('--num-val', type=int, default=50, help='images generated for evaluation')
    parser.add_argument('--size', type=int, default=128, help='height of the generated images')
    parser.add_argument('--iters', type=int, default=None, help='override the config\'s max_iters')
    parser.add_argument('--num-figure-images', type=int, default=6)
    parser.add_argument('--threads', type=int, default=None,
                        help="torch CPU threads (default: torch's, or 1 when the machine is already "
                        'busier than its core count)')
    parser.add_argument('--seed', type=int, default=0)
    return parser.parse_args(argv)


def choose_cpu_threads(requested=None):
    """Set torch's intra-op threads; returns (threads, reason).

    On a machine already running more busy threads than it has cores, one thread per process
    trains this demo faster than one per core (the threads of one process wait for each other at
    every parallel region), even with passive OpenMP waiting; on an idle machine torch's default
    (one per core) is fastest.
    """
    import torch
    if requested:
        torch.set_num_threads(requested)
        return requested, '--threads'
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, 'getloadavg') else 0.0
    if cores > 1 and load > cores:
        torch.set_num_threads(1)
        return 1, f'load average {load:.1f} > {cores} cores'
    return torch.get_num_threads(), 'one per core'


def build_config(args):
    cfg = config.load_config(args.config)
    config.register_task_modules(cfg)
    if args.iters is not None:
        cfg.train_cfg.max_iters = args.iters
        cfg.train_cfg.val_interval = args.iters
        cfg.default_hooks.checkpoint.interval = args.iters
        warmup, decay = cfg.param_scheduler
        warmup.end = min(warmup.end, max(1, args.iters // 10))
        decay.begin, decay.end = warmup.end, args.iters
    notes = demo.prepare_demo_config(cfg, args.work_dir, args.data_root, args.seed, PRETRAINED)
    return cfg, notes


def predict_masks(runner, count):
    """(RGB image, ground truth, predicted labels) of the first ``count`` validation images."""
    import torch
    model = runner.model
    model.eval()
    dataset = runner.val_dataloader.dataset
    results = []
    with torch.no_grad():
        for index in range(min(count, len(dataset))):
            batch = runner.val_dataloader.collate_fn([dataset[index]])
            sample = model.test_step(batch)[0].cpu()
            image = cv2.imread(sample.img_path)[..., ::-1]
            results.append((image, sample.gt_sem_seg.data[0].numpy(), sample.pred_sem_seg.data[0].numpy()))
    return results


def colourise(labels, palette, ignore_index=255):
    """Label map -> RGB with the dataset palette; ignored pixels (label 0 of the files) black."""
    lut = np.zeros((256, 3), np.uint8)
    lut[:len(palette)] = palette
    lut[ignore_index] = 0
    return lut[labels]


def save_segmentation_figure(path, untrained, trained, palette, caption, factor=2, gap=4):
    """Rows of image | ground truth | untrained prediction | trained prediction."""
    columns = ('image', 'ground truth', 'untrained', 'trained')
    width = factor * max(image.shape[1] for image, _, _ in trained)
    rows = []
    for (image, truth, before), (_, _, after) in zip(untrained, trained):
        panels = [image] + [colourise(labels, palette) for labels in (truth, before, after)]
        panels = [cv2.resize(p, None, fx=factor, fy=factor, interpolation=cv2.INTER_NEAREST) for p in panels]
        panels = [cv2.copyMakeBorder(p, 0, gap, 0, gap + width - p.shape[1], cv2.BORDER_CONSTANT,
                                     value=(255, 255, 255)) for p in panels]
        rows.append(np.concatenate(panels, axis=1))
    lines = [line for line in caption.splitlines() if line]
    header = np.full((20 * len(lines) + 26, rows[0].shape[1], 3), 255, np.uint8)
    for i, line in enumerate(lines):
        cv2.putText(header, line, (6, 20 * (i + 1)), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
    for i, title in enumerate(columns):
        cv2.putText(header, title, (i * (width + gap) + 6, 20 * len(lines) + 20), cv2.FONT_HERSHEY_SIMPLEX,
                    0.5, (0, 0, 0), 1, cv2.LINE_AA)
    figure = np.concatenate([header] + rows, axis=0)
    cv2.imwrite(path, figure[..., ::-1])
    return figure


def format_metrics(metrics):
    return {label: round(float(metrics.get(key, float('nan'))), 2) for key, label in REPORTED}


def main(argv=None):
    args = parse_args(argv)
    tune_malloc()  # reuse freed CPU tensors instead of page-faulting them in again (see its doc)
    start = time.time()
    with cli.exit_on_user_error():
        if not demo_ade_is_complete(args.data_root, args.num_train, args.num_val, args.size, args.seed):
            print(f'Generating the demo dataset in {args.data_root} ...', flush=True)
            make_demo_ade(args.data_root, args.num_train, args.num_val, args.size, args.seed)
        cfg, notes = build_config(args)

    threads, reason = choose_cpu_threads(args.threads)
    init = PRETRAINED if osp.isfile(PRETRAINED) else 'random initialisation'

    def untrained_predictions(runner):
        # Initialise now (train() does not initialise twice) so that the untrained predictions of
        # the figure come from the very model that the initial evaluation scores and training starts from.
        runner.model.init_weights()
        return predict_masks(runner, args.num_figure_images)

    result = demo.run_demo(cfg, notes + [f'{threads} torch CPU thread(s) ({reason})'],
                           f'Demo: UperNet + Pola-Swin-T from {init}, {cfg.train_cfg.max_iters} iterations '
                           f'on {args.data_root}', before_train=untrained_predictions)
    runner, train_seconds, untrained = result.runner, result.train_seconds, result.before_train
    trained = predict_masks(runner, args.num_figure_images)
    before, after = format_metrics(result.initial_metrics), format_metrics(result.final_metrics)
    figure_path = osp.join(args.work_dir, 'predictions.png')
    caption = (f'UperNet + Pola-Swin-T ({init}), {runner.iter} iterations on demo_ade: '
               f'mIoU {before["mIoU"]:.1f} -> {after["mIoU"]:.1f}')
    save_segmentation_figure(figure_path, untrained, trained, runner.val_dataloader.dataset.metainfo['palette'],
                             caption)

    total_seconds = time.time() - start
    summary = dict(config=demo.config_label(args.config, REPO_ROOT),
                   backbone_init=init, iterations=runner.iter, before=before,
                   after=after, cpu_threads=threads, train_seconds=round(train_seconds, 1),
                   total_seconds=round(total_seconds, 1), figure=figure_path)
    summary_path = demo.write_summary(args.work_dir, summary)

    num_val = len(runner.val_dataloader.dataset)
    lines = ['', f'Segmentation demo (IoUMetric on the {num_val} generated validation images, %)',
             f'  {"":5}  untrained  trained']
    lines += [f'  {label:5}  {before[label]:9.2f}  {after[label]:7.2f}' for _, label in REPORTED]
    lines += [f'  training: {runner.iter} iterations in {train_seconds / 60:.1f} min; '
              f'total {total_seconds / 60:.1f} min',
              f'  figure: {figure_path}', f'  summary: {summary_path}']
    runner.logger.info('\n'.join(lines))
    if args.iters is None:
        demo.check_learned('tools/demo_segmentation.py', after, LEARNED, args.work_dir)
    return summary


if __name__ == '__main__':
    main()
