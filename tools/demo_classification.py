#!/usr/bin/env python3
"""Classification demo: train a small Pola-PVT from scratch on a generated ImageNet-layout dataset
for a few CPU minutes and show that it learns.

    python tools/demo_classification.py

1. generates data/demo_imagenet (tools/make_demo_imagenet.py) unless it is already there;
2. evaluates the untrained model (top-1 / top-3 accuracy; chance is 1/6 = 16.7 % top-1);
3. trains (configs/demo/pola-pvt_demo-imagenet-64x64.py; progress every 10 iterations);
4. evaluates again, prints both results, per-class accuracy and the wall time, and writes
   work_dirs/demo_classification/summary.json. The checkpoint (work_dirs/demo_classification/
   epoch_12.pth) is an ordinary classification checkpoint: tools/test.py evaluates it and the
   dense configs' backbones load its ``backbone.*`` weights;
5. with the default schedule, exits 1 with one line when the trained top-1 stays under 60 % (the
   trained figures differ between CPUs by a few points: docs/classification.md).

Everything runs in this process, on the CPU (or the first GPU when there is one).
"""
import argparse
import os.path as osp
import sys
import time

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
import _mmpola_tools  # noqa: E402,F401  (first: environment defaults before torch, repo on sys.path)
from _mmpola_tools import REPO_ROOT  # noqa: E402

import mmpola  # noqa: E402,F401  (backbones, safe checkpoint loading)
from mmpola.classification.demo_imagenet import demo_imagenet_is_complete, make_demo_imagenet  # noqa: E402
from mmpola.runtime import cli, config, demo  # noqa: E402
from mmpola.runtime.allocator import tune_malloc  # noqa: E402

DEFAULT_CONFIG = osp.join(REPO_ROOT, 'configs', 'demo', 'pola-pvt_demo-imagenet-64x64.py')
# The pass/fail check of the default run (demo.check_learned): trained top-1 in %. Measured 80.2 - 87.5 on
# two CPUs with their own (AVX-512, AVX2) and the generic kernels, 1 and 2 threads (docs/classification.md);
# chance 16.7.
LEARNED = {'accuracy/top1': 60.0}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Pola-PVT ImageNet-style classification demo (CPU friendly)')
    parser.add_argument('--config', default=DEFAULT_CONFIG)
    parser.add_argument('--work-dir', default='work_dirs/demo_classification')
    parser.add_argument('--data-root', default='data/demo_imagenet')
    parser.add_argument('--num-train', type=int, default=50, help='training images generated per class')
    parser.add_argument('--num-val', type=int, default=16, help='validation images generated per class')
    parser.add_argument('--epochs', type=int, default=None, help='override the config (12)')
    parser.add_argument('--seed', type=int, default=0)
    return parser.parse_args(argv)


def build_config(args):
    cfg = config.load_config(args.config)
    config.register_task_modules(cfg)
    if args.epochs is not None:
        epochs = args.epochs
        cfg.train_cfg.max_epochs = epochs
        cfg.train_cfg.val_interval = epochs
        cfg.default_hooks.checkpoint.interval = epochs
        warmup, cosine = cfg.param_scheduler
        if epochs <= cosine.begin:  # no epoch after the warm-up's: the warm-up alone, over the run
            warmup.end = epochs
            cfg.param_scheduler = [warmup]
        else:
            cosine.end = epochs
            cosine.T_max = epochs - cosine.begin
    notes = demo.prepare_demo_config(cfg, args.work_dir, args.data_root.rstrip('/') + '/', args.seed)
    return cfg, notes


def per_class_accuracy(runner):
    """Top-1 accuracy (%) of each class on the validation set, with the trained model."""
    import torch
    model = runner.model
    model.eval()
    classes = runner.val_dataloader.dataset.metainfo['classes']
    hits, counts = [0] * len(classes), [0] * len(classes)
    with torch.no_grad():
        for batch in runner.val_dataloader:
            for result in model.val_step(batch):
                label = int(result['gt_label'])
                counts[label] += 1
                hits[label] += int(int(result['pred_label']) == label)
    return {name: round(100.0 * h / max(c, 1), 1) for name, h, c in zip(classes, hits, counts)}


def main(argv=None):
    args = parse_args(argv)
    tune_malloc()  # reuse freed CPU tensors instead of page-faulting them in again (see its doc)
    start = time.time()
    with cli.exit_on_user_error():
        if not demo_imagenet_is_complete(args.data_root):
            print(f'Generating the demo dataset in {args.data_root} ...', flush=True)
            make_demo_imagenet(args.data_root, num_train=args.num_train, num_val=args.num_val,
                               seed=args.seed)
        cfg, notes = build_config(args)

    def description(runner):
        num_params = sum(p.numel() for p in runner.model.parameters())
        return (f'Demo: Pola-PVT ({num_params / 1e6:.2f} M parameters) from random initialisation, '
                f'{cfg.train_cfg.max_epochs} epochs on {args.data_root}')

    result = demo.run_demo(cfg, notes, description)
    runner, train_seconds = result.runner, result.train_seconds
    num_params = sum(p.numel() for p in runner.model.parameters())
    before, after = result.initial_metrics, result.final_metrics
    classes_acc = per_class_accuracy(runner)
    total_seconds = time.time() - start

    keys = sorted(k for k in after if k.startswith('accuracy/'))
    summary = dict(config=demo.config_label(args.config, REPO_ROOT),
                   parameters=num_params, epochs=cfg.train_cfg.max_epochs,
                   iterations=runner.iter, before={k: round(before.get(k, float('nan')), 2) for k in keys},
                   after={k: round(after[k], 2) for k in keys}, per_class_top1=classes_acc,
                   train_seconds=round(train_seconds, 1), total_seconds=round(total_seconds, 1),
                   checkpoint=osp.join(args.work_dir, f'epoch_{cfg.train_cfg.max_epochs}.pth'))
    summary_path = demo.write_summary(args.work_dir, summary)

    num_val = len(runner.val_dataloader.dataset)
    num_classes = len(classes_acc)
    lines = ['', f'Classification demo ({num_val} generated validation images, {num_classes} classes, '
             f'chance {100 / num_classes:.1f} % top-1)', f'  {"":14}  untrained  trained']
    lines += [f'  {k:14}  {before.get(k, float("nan")):8.1f}%  {after[k]:6.1f}%' for k in keys]
    lines += ['  per class (top-1, trained): '
              + ', '.join(f'{name} {acc:.0f}%' for name, acc in classes_acc.items()),
              f'  training: {runner.iter} iterations in {train_seconds / 60:.1f} min; '
              f'total {total_seconds / 60:.1f} min',
              f'  checkpoint: {summary["checkpoint"]}',
              f'  summary: {summary_path}']
    runner.logger.info('\n'.join(lines))
    if args.epochs is None:
        demo.check_learned('tools/demo_classification.py', after, LEARNED, args.work_dir)
    return summary


if __name__ == '__main__':
    main()
