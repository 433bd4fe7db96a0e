"""Machine and launcher adaptation: the same configs and scripts run on a GPU cluster and on a CPU box.

Without CUDA the process group uses gloo, DDP gets no CUDA device ids, SyncBN becomes BN where it
cannot synchronise and ``--amp`` becomes bf16 autocast; :func:`init_distributed` starts a gloo
group where mmengine's launch functions would call ``torch.cuda.set_device``.
"""
import os
import subprocess
from datetime import timedelta

import torch

from mmpola.errors import UserError

__all__ = ['replace_sync_bn', 'adapt_cfg_to_machine', 'setup_amp', 'init_distributed']


# Types mmcv registers for synchronised batch norm (torch's and mmcv's own implementation).
_SYNC_BN_TYPES = ('SyncBN', 'MMSyncBN', 'TorchSyncBN')



def replace_sync_bn(node):
    """Rewrite every ``type='SyncBN'``-like norm config below ``node`` to plain ``BN`` (in place)."""
    count = 0
    if isinstance(node, dict):
        if node.get('type') in _SYNC_BN_TYPES:
            node['type'] = 'BN'
            count += 1
        for value in node.values():
            count += replace_sync_bn(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            count += replace_sync_bn(value)
    return count



def adapt_cfg_to_machine(cfg, launcher='none'):
    """Make a cluster config run here: returns a list of human-readable notes on what changed.

    * no CUDA: the process group uses gloo, DDP gets no CUDA ``device_ids``, CUDA AMP becomes
      bf16 autocast on the CPU (:class:`mmpola.engine.BF16AmpOptimWrapper`);
    * one process, or no GPU: SyncBN cannot synchronise anything (and has no CPU kernel), so
      ``SyncBN`` norm configs become ``BN`` and ``sync_bn`` conversion is dropped. mmengine
      reverts SyncBN layers for single-process runs too, but only after building; rewriting the
      config also makes the dumped config tell the truth.
    """
    notes = []
    cuda = torch.cuda.is_available()
    distributed = launcher != 'none'
    cfg.launcher = launcher
    if not cuda:
        env_cfg = cfg.setdefault('env_cfg', {})
        dist_cfg = env_cfg.setdefault('dist_cfg', {})
        if dist_cfg.get('backend', 'nccl') != 'gloo':
            dist_cfg['backend'] = 'gloo'
            notes.append('no CUDA device: distributed backend set to gloo')
        env_cfg['cudnn_benchmark'] = False
        if distributed:
            wrapper = cfg.get('model_wrapper_cfg') or dict(
                type='MMDistributedDataParallel', broadcast_buffers=False,
                find_unused_parameters=cfg.get('find_unused_parameters', False))
            wrapper['device_ids'] = None  # DDP refuses CUDA device ids for a CPU module
            cfg.model_wrapper_cfg = wrapper
        optim_wrapper = cfg.get('optim_wrapper')
        if isinstance(optim_wrapper, dict) and optim_wrapper.get('type') == 'AmpOptimWrapper':
            _to_bf16_amp(cfg, optim_wrapper)
            notes.append('no CUDA device: AMP runs as bf16 autocast of the backbone on the CPU')
    if not cuda or not distributed:
        count = replace_sync_bn(cfg.get('model', {}))
        if count:
            why = 'no CUDA device' if not cuda else 'single process'
            notes.append(f'{why}: {count} SyncBN norm config(s) replaced by BN')
        if cfg.get('sync_bn') is not None:
            cfg.pop('sync_bn')
            notes.append('sync_bn conversion dropped (nothing to synchronise)')
    return notes



def _to_bf16_amp(cfg, optim_wrapper):
    optim_wrapper['type'] = 'BF16AmpOptimWrapper'
    # the dumped config must find the wrapper again when it is reloaded on its own
    custom_imports = cfg.setdefault('custom_imports', dict(imports=[], allow_failed_imports=False))
    if 'mmpola.engine' not in custom_imports['imports']:
        custom_imports['imports'] = list(custom_imports['imports']) + ['mmpola.engine']
    optim_wrapper['dtype'] = 'bfloat16'
    optim_wrapper.pop('loss_scale', None)  # bf16 keeps fp32's exponent range: no loss scaling
    optim_wrapper.pop('use_fsdp', None)



def setup_amp(cfg, dtype=None):
    """Switch the optimizer wrapper to mixed precision (``--amp``).

    CUDA, fp16 (default): mmengine's ``AmpOptimWrapper`` with dynamic loss scaling over the whole
    model. bf16 (the CPU's only choice, or ``dtype='bfloat16'`` on CUDA):
    :class:`mmpola.engine.BF16AmpOptimWrapper`, which autocasts the backbone, because mmcv's
    detection kernels do not take bf16. The Pola attention core computes in fp32 either way.
    """
    optim_wrapper = cfg.optim_wrapper
    if optim_wrapper.get('type', 'OptimWrapper') not in ('OptimWrapper', 'AmpOptimWrapper',
                                                         'BF16AmpOptimWrapper'):
        raise UserError(f"--amp cannot wrap optim_wrapper type {optim_wrapper['type']!r}")
    if torch.cuda.is_available() and dtype in (None, 'float16'):
        optim_wrapper['type'] = 'AmpOptimWrapper'
        optim_wrapper.setdefault('loss_scale', 'dynamic')
        optim_wrapper['dtype'] = 'float16'
        return 'AMP: float16 autocast on CUDA with dynamic loss scaling'
    if dtype == 'float16':
        raise UserError('--amp-dtype float16 needs a CUDA device; on the CPU --amp uses bfloat16')
    _to_bf16_amp(cfg, optim_wrapper)
    return f"AMP: bfloat16 autocast of the backbone on {'CUDA' if torch.cuda.is_available() else 'the CPU'}"



def init_distributed(launcher, cfg):
    """Start the process group on CPU-only machines, where mmengine's ``init_dist`` cannot.

    mmengine's launch functions call ``torch.cuda.set_device`` unconditionally; without a GPU we
    initialise gloo ourselves from the variables torchrun or slurm set, and mmengine then finds
    the group ready. With CUDA this does nothing and mmengine starts NCCL as usual.
    """
    import torch.distributed as dist
    if launcher == 'none' or torch.cuda.is_available() or dist.is_initialized():
        return
    timeout = cfg.get('env_cfg', {}).get('dist_cfg', {}).get('timeout', 1800)
    if launcher == 'pytorch':
        missing = [k for k in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT') if k not in os.environ]
        if missing:
            raise UserError(f'--launcher pytorch expects torchrun to set {", ".join(missing)}; '
                            'start it with tools/dist_train.sh or tools/dist_test.sh')
    elif launcher == 'slurm':
        os.environ['RANK'] = os.environ['SLURM_PROCID']
        os.environ['WORLD_SIZE'] = os.environ['SLURM_NTASKS']
        os.environ['LOCAL_RANK'] = os.environ.get('SLURM_LOCALID', '0')
        if 'MASTER_ADDR' not in os.environ:
            node_list = os.environ['SLURM_NODELIST']
            os.environ['MASTER_ADDR'] = subprocess.getoutput(
                f'scontrol show hostname {node_list} | head -n1').strip()
        os.environ.setdefault('MASTER_PORT', '29500')
    else:
        raise UserError(f'--launcher {launcher} needs CUDA; on CPU use pytorch (tools/dist_*.sh) or slurm')
    dist.init_process_group(backend='gloo', timeout=timedelta(seconds=timeout))
