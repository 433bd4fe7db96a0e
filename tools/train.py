#!/usr/bin/env python3
"""Train a detector, segmentor or classifier from a config (one entry point for every task).

    python tools/train.py CONFIG [--work-dir DIR] [--amp] [--resume [CHECKPOINT]] [--device auto|cuda|cpu]
                          [--cfg-options KEY=VALUE ...] [--launcher none|pytorch|slurm|mpi]

The task library comes from the config's ``default_scope`` (mmdet, mmseg, ...). Several processes:
tools/dist_train.sh (torchrun) or tools/slurm_train.sh. Without usable CUDA a multi-process launch
stops with the cause; with --device cpu the same commands run on the CPU (gloo process group,
SyncBN -> BN, bf16 autocast for --amp).
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
import _mmpola_tools  # noqa: E402,F401  (first: environment defaults before torch, repo on sys.path)

# mmpola before anything that loads a checkpoint: it registers the backbones and the safe
# checkpoint-loading allowlist that every torch.load below (pretrained weights, --resume) goes through
import mmpola  # noqa: E402,F401
from mmpola.errors import UserError  # noqa: E402
from mmpola.runtime import cli, launch  # noqa: E402
from mmpola.runtime.allocator import tune_malloc  # noqa: E402
from mmpola.runtime.checkpoint_fit import add_checkpoint_fit_check  # noqa: E402
from mmpola.runtime.checkpointing import add_safe_checkpointing  # noqa: E402
from mmpola.runtime.data_checks import run_preflight  # noqa: E402
from mmpola.runtime.hooks import add_nonfinite_loss_guard  # noqa: E402
from mmpola.runtime.resume import add_random_state_hook  # noqa: E402
from mmpola.runtime.workdir import lock_work_dir  # noqa: E402


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
                        'in the work dir')
    parser.add_argument('--skip-data-check', action='store_true', help='skip the pre-flight check of the '
                        'data (files, annotations, segmentation maps, classes vs num_classes)')
    cli.add_launch_args(parser)
    return cli.parse_tool_args(parser, argv)


def check_resumable(path):
    """An explicit --resume file must be a training checkpoint (weights + meta), not weights only."""
    from mmpola.checkpoint.safe_load import safe_torch_load
    checkpoint = safe_torch_load(path)  # refuses a code-running pickle (UnsafeCheckpointError)
    if not (isinstance(checkpoint, dict) and 'meta' in checkpoint and 'state_dict' in checkpoint):
        keys = sorted(checkpoint)[:5] if isinstance(checkpoint, dict) else type(checkpoint).__name__
        raise UserError(
            f'--resume {path}: this is not a training checkpoint written by tools/train.py (it has no '
            f'meta/state_dict, top-level keys: {keys}), so there is no iteration, optimizer or scheduler '
            f'state to resume. To start a new run from its weights, drop --resume and use '
            f'--cfg-options load_from={path} (weights of this same model) or model.backbone.init_cfg.checkpoint={path} '
            f'(official PolaFormer / ImageNet weights for the backbone).')


def build_train_config(args):
    """The config as the Runner will get it, after flags, machine fallbacks and input checks."""
    launch.check_device(args.launcher, args.device)  # never a silent CPU run (--device cpu asks for one)
    cfg = cli.load_config(args.config, args.cfg_options)
    scope = cli.register_task_modules(cfg)
    cli.set_work_dir(cfg, args.config, args.work_dir)
    # a NaN / inf loss stops the run before the optimizer step, with a clear message (or the
    # step is skipped: --cfg-options nonfinite_loss.action=skip); see NonFiniteLossHook
    add_nonfinite_loss_guard(cfg)
    add_random_state_hook(cfg)  # RNG states in checkpoints: a resumed run repeats the interrupted one
    add_checkpoint_fit_check(cfg)  # load_from / --resume: refuse a checkpoint of another model
    # atomic saves, old checkpoints removed only after, a checkpoint on SIGTERM, --resume skips broken files
    add_safe_checkpointing(cfg)

    notes = []
    if args.amp:
        notes.append(launch.setup_amp(cfg, args.amp_dtype))
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg or 'base_batch_size' not in cfg.auto_scale_lr:
            raise UserError('--auto-scale-lr needs auto_scale_lr=dict(base_batch_size=...) '
                                    'in the config')
        cfg.auto_scale_lr.enable = True

    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cli.check_checkpoint_file(args.resume, '--resume checkpoint')
        check_resumable(args.resume)
        cfg.resume = True
        cfg.load_from = args.resume
    elif cfg.get('load_from'):
        cli.check_checkpoint_file(cfg.load_from, 'load_from checkpoint')

    notes += launch.adapt_cfg_to_machine(cfg, args.launcher)
    cli.check_pretrained_files(cfg)
    keys = ['train_dataloader'] + (['val_dataloader'] if cfg.get('val_cfg') else [])
    launch.init_distributed(args.launcher, cfg)  # so that the ranks can share the pre-flight verdict
    run_preflight(cfg, keys, args.skip_data_check)
    return cfg, scope, notes


def build_runner(args):
    """Build (but do not start) the Runner; tests use this to inspect a resumed run."""
    cfg, scope, notes = build_train_config(args)
    # one run per work dir, before the Runner writes to it; rank 0 locks, every rank gets its verdict
    launch.run_on_rank0_and_share(lock_work_dir, cfg.work_dir, args.launcher)
    return cli.build_runner(cfg, args.launcher, notes)


def main(argv=None):
    args = parse_args(argv)
    tune_malloc()  # reuse freed CPU tensors instead of page-faulting them in again (see its doc)
    with cli.exit_on_user_error():
        runner = build_runner(args)
    with cli.exit_on_user_error(runner.logger):  # e.g. a NaN loss: the message says it all
        runner.train()
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():  # an orderly end: gloo can abort at exit otherwise
        dist.barrier()
        dist.destroy_process_group()


if __name__ == '__main__':
    main()
