"""Evaluate a trained checkpoint on a config's test set (one entry point for every task).

    python tools/test.py CONFIG CHECKPOINT [--work-dir DIR] [--out results.pkl] [--show-dir DIR]
                         [--cfg-options KEY=VALUE ...] [--launcher none|pytorch|slurm|mpi]

Metrics come from the config's test_evaluator (CocoMetric bbox/segm for detection, IoUMetric for
segmentation). Several processes: tools/dist_test.sh or tools/slurm_test.sh; without a GPU the
same commands run on the CPU.
"""
import os

# Idle OpenMP threads sleep instead of spinning. On a CPU shared with other jobs, spinning threads
# wait for descheduled peers at every parallel region: a CPU training step measured 15 s with the
# default policy and 1.5 s with this one (2 threads, 2 busy cores); idle machines barely notice.
# It must be set before torch loads OpenMP; an explicit OMP_WAIT_POLICY wins.
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')

import argparse
import os.path as osp
import sys

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)  # run from a plain checkout, without `pip install -e .`

# import mmpola first: it registers the backbones and the safe checkpoint-loading allowlist
import mmpola  # noqa: E402,F401
from mmengine.config import DictAction  # noqa: E402

from mmpola.engine.allocator import tune_malloc  # noqa: E402
from mmpola.engine import runtime  # noqa: E402
from mmpola.safe_load import UnsafeCheckpointError  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Test (and evaluate) a model checkpoint')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file (path or URL)')
    parser.add_argument('--work-dir', help='where to save the log and metrics '
                        '(default: ./work_dirs/<config name>)')
    parser.add_argument('--out', help='also dump the raw predictions: a .pkl file (detection, '
                        'classification) or a folder of prediction maps (segmentation)')
    parser.add_argument('--show', action='store_true', help='show predictions in a window')
    parser.add_argument('--show-dir', help='save images with predictions drawn next to the ground truth')
    parser.add_argument('--wait-time', type=float, default=2, help='seconds per image with --show')
    parser.add_argument('--tta', action='store_true', help="test-time augmentation with the config's "
                        '`tta_model` and `tta_pipeline` (e.g. mmseg multi-scale + flip)')
    parser.add_argument('--amp', action='store_true', help='run inference under fp16 autocast (CUDA only)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, e.g. test_dataloader.batch_size=2')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'], default='none',
                        help='job launcher (set by tools/dist_test.sh and tools/slurm_test.sh)')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def build_test_config(args):
    cfg = runtime.load_config(args.config, args.cfg_options)
    scope = runtime.register_task_modules(cfg)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])

    runtime.check_checkpoint_file(args.checkpoint)
    cfg.load_from = args.checkpoint
    cfg.resume = False
    if args.amp:
        import torch
        if not torch.cuda.is_available():
            raise runtime.UserError('test-time --amp needs a CUDA device (on the CPU, autocast would '
                                    "send bf16 tensors to mmcv's fp32-only kernels)")
        cfg.test_cfg = dict(cfg.get('test_cfg') or dict(type='TestLoop'), fp16=True)
    if args.tta:
        runtime.enable_tta(cfg)
    if args.show or args.show_dir:
        runtime.enable_test_visualization(cfg, args.show_dir, scope, args.show, args.wait_time)
    if args.out:
        runtime.enable_test_dump(cfg, args.out, scope)

    notes = runtime.adapt_cfg_to_machine(cfg, args.launcher)
    runtime.check_data_files(cfg, ['test_dataloader'])
    return cfg, scope, notes


def build_runner(args):
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    cfg, scope, notes = build_test_config(args)
    runtime.init_distributed(args.launcher, cfg)
    runner = Runner.from_cfg(cfg) if 'runner_type' not in cfg else RUNNERS.build(cfg)
    for note in notes:
        runner.logger.info(f'[mmpola] {note}')
    return runner


def main(argv=None):
    args = parse_args(argv)
    tune_malloc()  # reuse freed CPU tensors instead of page-faulting them in again (see its doc)
    with runtime.exit_on_user_error():
        runner = build_runner(args)
        try:
            return runner.test()
        except UnsafeCheckpointError as e:  # a checkpoint that would run code: the user's to fix
            raise runtime.UserError(str(e)) from e


if __name__ == '__main__':
    main()
