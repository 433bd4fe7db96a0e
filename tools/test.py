#!/usr/bin/env python3
"""Evaluate a trained checkpoint on a config's test set (one entry point for every task).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out results.pkl] [--show-dir DIR]
                         [--cfg-options KEY=VALUE ...] [--launcher none|pytorch|slurm|mpi] [--device auto|cuda|cpu]

Metrics come from the config's test_evaluator (CocoMetric bbox/segm for detection, IoUMetric for
segmentation). Several processes: tools/dist_test.sh or tools/slurm_test.sh; without a GPU they
run on the CPU when asked to with --device cpu.
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
import _mmpola_tools  # noqa: E402,F401  (first: environment defaults before torch, repo on sys.path)

# mmpola first: it registers the backbones, mmpola's hooks and the checkpoint allowlist
import mmpola  # noqa: E402,F401
from mmpola.errors import UserError  # noqa: E402
from mmpola.ops import implementation_note  # noqa: E402
from mmpola.runtime import cli, config, launch  # noqa: E402
from mmpola.runtime.allocator import tune_malloc  # noqa: E402
from mmpola.runtime.config_check import check_config, runtime_hook_notes  # noqa: E402
from mmpola.runtime.preflight import run_preflight  # noqa: E402
from mmpola.runtime.workdir import check_work_dir  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Test (and evaluate) a model checkpoint')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file (path or URL)')
    parser.add_argument('--work-dir', help='where to save the log and metrics '
                        '(default: ./work_dirs/<config name>)')
    parser.add_argument('--out', help='also dump the raw predictions: a .pkl file (detection, '
                        'classification) or a folder of prediction maps (segmentation)')
    parser.add_argument('--show', action='store_true', help='show predictions in a window')
    parser.add_argument('--show-dir', help='save every test image with its predictions drawn next to the ground '
                        'truth into this folder (as given: relative to the current directory)')
    parser.add_argument('--wait-time', type=float, default=2, help='seconds per image with --show')
    parser.add_argument('--tta', action='store_true', help="test-time augmentation with the config's "
                        '`tta_model` and `tta_pipeline` (flips; multi-scale for mmseg and the 3x detection configs)')
    parser.add_argument('--amp', action='store_true', help='run inference under fp16 autocast (CUDA only)')
    cli.add_check_args(parser)
    cli.add_launch_args(parser)
    return cli.parse_tool_args(parser, argv)


def build_test_config(args):
    config.check_config_file(args.config)  # a wrong path is the one thing said
    launch.check_device(args.launcher, args.device)  # never a silent CPU run (--device cpu asks for one)
    implementations = implementation_note()  # an unknown MMPOLA_* implementation: one line, before anything is built
    cfg = config.load_config(args.config, args.cfg_options)
    scope = config.register_task_modules(cfg)
    config.set_work_dir(cfg, args.config, args.work_dir)
    check_work_dir(cfg.work_dir)  # a file, or not writable: before anything is built (the log goes there)

    cfg.load_from = args.checkpoint
    cfg.resume = False
    if args.amp:
        import torch
        if not torch.cuda.is_available():
            raise UserError('test-time --amp needs a CUDA device (on the CPU, autocast would '
                            "send bf16 tensors to mmcv's fp32-only kernels)")
        cfg.test_cfg = dict(cfg.get('test_cfg') or dict(type='TestLoop'), fp16=True)
    if args.tta:
        cli.enable_tta(cfg)
    if args.show or args.show_dir:
        cli.enable_test_visualization(cfg, args.show_dir, scope, args.show, args.wait_time)
    if args.out:
        cli.enable_test_dump(cfg, args.out, scope)

    notes = [implementations] + launch.adapt_cfg_to_machine(cfg, args.launcher)
    notes += runtime_hook_notes(cfg, training=False)
    if not args.skip_config_check:
        check_config(cfg, training=False)  # misspelled types and arguments (what a test run builds)
    launch.init_distributed(args.launcher, cfg)  # so that the ranks can share the pre-flight verdict
    run_preflight(cfg, ['test_dataloader'], args.skip_data_check)  # the checkpoint, data, model
    return cfg, scope, notes


def build_runner(args):
    cfg, scope, notes = build_test_config(args)
    return cli.build_runner(cfg, args.launcher, notes)


def main(argv=None):
    args = parse_args(argv)
    tune_malloc()  # reuse freed CPU tensors instead of page-faulting them in again (see its doc)
    with cli.exit_on_user_error():
        runner = build_runner(args)
    with cli.exit_on_user_error(runner.logger):  # e.g. a refused checkpoint (it would run code)
        metrics = runner.test()
    del runner  # released while the process group still exists (launch.end_distributed)
    launch.end_distributed()
    return metrics


if __name__ == '__main__':
    main()
