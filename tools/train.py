#!/usr/bin/env python3
"""Train a detector, segmentor or classifier from a config (one entry point for every task).

    python tools/train.py CONFIG [--work-dir DIR] [--amp] [--resume [CHECKPOINT] | --resume-or-start]
                          [--device auto|cuda|cpu]
                          [--cfg-options KEY=VALUE ...] [--launcher none|pytorch|slurm|mpi]
                          [--skip-data-check] [--skip-config-check] [--no-work-dir-lock]

The task library comes from the config's ``default_scope`` (mmdet, mmseg, ...). Several processes:
tools/dist_train.sh (torchrun) or tools/slurm_train.sh. Without usable CUDA a multi-process launch
stops with the cause; with --device cpu the same commands run on the CPU (gloo process group,
SyncBN -> BN, bf16 autocast for --amp).

What only a tool can do happens here, each step switchable: the device check (--device), the
machine's fallbacks, the config check (--skip-config-check), the pre-flight checks of checkpoints
and data (--skip-data-check), the work dir's lock (--no-work-dir-lock) and the CPU allocator settings
(MMPOLA_MALLOC_TUNING=0). Everything that happens during the run comes from the config.
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
from mmpola.runtime.config_check import backbone_implementation_notes, check_config, runtime_hook_notes  # noqa: E402
from mmpola.runtime.preflight import run_preflight  # noqa: E402
from mmpola.runtime.resume import RESUME_OR_START, check_new_run_work_dir  # noqa: E402
from mmpola.runtime.signals import stopped_cleanly  # noqa: E402
from mmpola.runtime.workdir import check_work_dir, lock_work_dir  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Train a model (detection, segmentation, classification)')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='where to save logs and checkpoints '
                        '(default: ./work_dirs/<config name>)')
    parser.add_argument('--amp', action='store_true', help='mixed precision: fp16 autocast with loss '
                        'scaling on CUDA; bf16 autocast of the backbone on the CPU (mmcv detection '
                        'kernels are fp32-only there) or with --amp-dtype bfloat16')
    parser.add_argument('--amp-dtype', choices=['float16', 'bfloat16'], default=None,
                        help='autocast dtype for --amp (default: float16 on CUDA, bfloat16 on the CPU)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the lr linearly with the total batch size (auto_scale_lr in the config)')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from CHECKPOINT, or, without a value, from the latest checkpoint '
                        'in the work dir (which must hold one: see --resume-or-start)')
    parser.add_argument('--resume-or-start', action='store_true',
                        help='resume from the latest checkpoint in the work dir, or start a new run there when it '
                        'holds none yet (job scripts that are started again after each interruption)')
    parser.add_argument('--no-work-dir-lock', action='store_true', help='do not take the work dir\'s lock '
                        '(by default a second training run into the same work dir stops)')
    cli.add_check_args(parser)
    cli.add_launch_args(parser)
    return cli.parse_tool_args(parser, argv)


def build_train_config(args):
    """The config as the Runner will get it, after flags, machine fallbacks and input checks.

    mmpola's hooks (safe checkpoints, RNG states, the non-finite loss guard, the checkpoint fit check)
    come from the config itself (configs/_base_/runtime.py); this tool adds none and replaces none."""
    config.check_config_file(args.config)  # a wrong path is the one thing said
    launch.check_device(args.launcher, args.device)  # never a silent CPU run (--device cpu asks for one)
    notes = [implementation_note()]  # an unknown MMPOLA_* implementation: one line, before anything is built
    cfg = config.load_config(args.config, args.cfg_options)
    scope = config.register_task_modules(cfg)
    config.set_work_dir(cfg, args.config, args.work_dir)
    check_work_dir(cfg.work_dir)  # a file, or not writable: before anything is built

    if args.amp:
        notes.append(launch.setup_amp(cfg, args.amp_dtype))
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in cfg.auto_scale_lr:
            raise UserError('--auto-scale-lr needs auto_scale_lr=dict(base_batch_size=...) in the config')
        cfg.auto_scale_lr.enable = True

    if args.resume_or_start:
        if args.resume not in (None, 'auto'):
            raise UserError('--resume-or-start continues from the work dir\'s latest checkpoint; it takes no '
                            'file (--resume CHECKPOINT continues from a file)')
        args.resume = 'auto'
        cfg[RESUME_OR_START] = True
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume

    notes += launch.adapt_cfg_to_machine(cfg, args.launcher)
    notes += runtime_hook_notes(cfg) + backbone_implementation_notes(cfg)
    if not args.skip_config_check:
        check_config(cfg)  # misspelled types and arguments, with the close matches
    # (an empty val_cfg=dict() is a validation loop too, as mmengine builds one)
    keys = ['train_dataloader'] + (['val_dataloader'] if cfg.get('val_cfg') is not None else [])
    launch.init_distributed(args.launcher, cfg)  # so that the ranks can share the pre-flight verdict
    run_preflight(cfg, keys, args.skip_data_check, training=True)  # checkpoints, data, model
    return cfg, scope, notes


def build_runner(args):
    """Build (but do not start) the Runner; tests use this to inspect a resumed run."""
    cfg, scope, notes = build_train_config(args)
    if not args.no_work_dir_lock:
        # one run per work dir, before the Runner writes to it; rank 0 locks, every rank gets its verdict
        launch.run_on_rank0_and_share(lock_work_dir, cfg.work_dir, args.launcher)
    if not cfg.get('resume'):  # an earlier run's checkpoints are not overwritten by a new run (a running one: the lock)
        launch.run_on_rank0_and_share(check_new_run_work_dir, cfg.work_dir)
    return cli.build_runner(cfg, args.launcher, notes)


def main(argv=None):
    args = parse_args(argv)
    tune_malloc()  # reuse freed CPU tensors instead of page-faulting them in again (see its doc)
    with cli.exit_on_user_error():
        runner = build_runner(args)
    with cli.exit_on_user_error(runner.logger):  # e.g. a NaN loss: the message says it all
        cli.check_train_batches(runner)
        with stopped_cleanly(runner):  # a second Ctrl-C, or what follows a stop signal: one line, no traceback
            runner.train()
    del runner  # released while the process group still exists (launch.end_distributed)
    launch.end_distributed()


if __name__ == '__main__':
    main()
