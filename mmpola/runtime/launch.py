"""Machine and launcher adaptation: the same configs and scripts run on a GPU cluster and on a CPU box.

Without CUDA the process group uses gloo, DDP gets no CUDA device ids, SyncBN becomes BN where it
cannot synchronise and ``--amp`` becomes bf16 autocast; :func:`init_distributed` starts a gloo
group where mmengine's launch functions would call ``torch.cuda.set_device``.

The CPU is never chosen silently: :func:`check_device` stops a multi-process launch (one process
per GPU) when CUDA is not usable, naming the cause, unless the CPU is asked for (``--device cpu``
or ``MMPOLA_DEVICE=cpu``); a single-process run goes on with one warning line.
:func:`run_on_rank0_and_share` runs a check once and gives every rank its verdict.
"""
import os
import pickle
import shutil
import subprocess
from datetime import timedelta

import torch

from mmpola.errors import MMPolaUserError, UserError

__all__ = ['replace_sync_bn', 'adapt_cfg_to_machine', 'setup_amp', 'init_distributed', 'check_device',
           'check_launch', 'check_slurm_environment', 'cuda_problem', 'end_distributed', 'probe_cuda',
           'run_on_rank0_and_share', 'DEVICE_ENV']

DEVICE_ENV = 'MMPOLA_DEVICE'


# Types mmcv registers for synchronised batch norm (torch's and mmcv's own implementation).
_SYNC_BN_TYPES = ('SyncBN', 'MMSyncBN', 'TorchSyncBN')



def replace_sync_bn(node):
    """Rewrite every ``type='SyncBN'``-like norm config below ``node`` to plain ``BN`` (in place)."""
    from .config import config_dicts
    found = [entry for entry in config_dicts(node) if entry.get('type') in _SYNC_BN_TYPES]
    for entry in found:
        entry['type'] = 'BN'
    return len(found)



def adapt_cfg_to_machine(cfg, launcher='none'):
    """Make a cluster config run here: returns a list of human-readable notes on what changed.

    * no CUDA: the process group uses gloo, DDP gets no CUDA ``device_ids``, CUDA AMP becomes
      bf16 autocast on the CPU (:class:`mmpola.runtime.BF16AmpOptimWrapper`);
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
    if 'mmpola.runtime' not in custom_imports['imports']:
        custom_imports['imports'] = list(custom_imports['imports']) + ['mmpola.runtime']
    optim_wrapper['dtype'] = 'bfloat16'
    optim_wrapper.pop('loss_scale', None)  # bf16 keeps fp32's exponent range: no loss scaling
    optim_wrapper.pop('use_fsdp', None)



def setup_amp(cfg, dtype=None):
    """Switch the optimizer wrapper to mixed precision (``--amp``).

    CUDA, fp16 (default): mmengine's ``AmpOptimWrapper`` with dynamic loss scaling over the whole
    model. bf16 (the CPU's only choice, or ``dtype='bfloat16'`` on CUDA):
    :class:`mmpola.runtime.BF16AmpOptimWrapper`, which autocasts the backbone, because mmcv's
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
    if launcher == 'none' or dist.is_initialized():
        return
    if launcher == 'slurm':
        check_slurm_environment()
    if torch.cuda.is_available():
        _init_cuda_distributed(launcher, cfg)
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


# what mmengine's (and mmpola's CPU) slurm start reads: the process's rank, the number of processes, the nodes
SLURM_VARIABLES = ('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_NODELIST')


def check_slurm_environment(environ=None):
    """``--launcher slurm``: raise :class:`UserError` when this process was not started by slurm's ``srun``
    (else a raw ``KeyError: 'SLURM_PROCID'``), or when the first node's address would come from a
    ``scontrol`` that is not installed (else its "not found" as the address)."""
    environ = os.environ if environ is None else environ
    missing = [name for name in SLURM_VARIABLES if name not in environ]
    if missing:
        raise UserError(f'--launcher slurm: this process was not started by slurm\'s srun ({", ".join(missing)} '
                        f'{"is" if len(missing) == 1 else "are"} not set). Fix: start it with tools/slurm_train.sh '
                        '(or tools/slurm_test.sh) PARTITION JOB_NAME CONFIG ..., which runs srun; without slurm: '
                        'tools/dist_train.sh CONFIG GPUS (torchrun), or leave out --launcher for one process.')
    if 'MASTER_ADDR' not in environ and shutil.which('scontrol', path=environ.get('PATH')) is None:
        raise UserError('--launcher slurm: the address of the first node comes from `scontrol show hostname '
                        f'{environ["SLURM_NODELIST"]}`, but scontrol is not installed here. Fix: set MASTER_ADDR '
                        '(and MASTER_PORT) to the first node\'s address in the job script.')


def _init_cuda_distributed(launcher, cfg):
    """Start the group as mmengine's Runner would (same ``env_cfg``), only earlier, so that checks
    made before the Runner exists can share their verdict (:func:`run_on_rank0_and_share`)."""
    import multiprocessing as mp

    from mmengine.dist import init_dist
    env_cfg = cfg.get('env_cfg', {})
    if mp.get_start_method(allow_none=True) is None:  # the Runner sets mp_cfg's method; keep it the same
        mp.set_start_method(env_cfg.get('mp_cfg', {}).get('mp_start_method', 'fork'))
    init_dist(launcher, **env_cfg.get('dist_cfg', {}))


# --------------------------------------------------------------------------------------------
# the device of a run: CUDA, or the CPU only when that was asked for

def requested_device(device=None, environ=None):
    """``--device`` if given, else ``MMPOLA_DEVICE``, else ``'auto'``."""
    environ = os.environ if environ is None else environ
    value = device or environ.get(DEVICE_ENV) or 'auto'
    if value not in ('auto', 'cpu', 'cuda'):
        raise UserError(f"{DEVICE_ENV}={value!r} is not a device choice; use 'cpu', 'cuda' or 'auto'")
    return value


def nvidia_smi_gpus():
    """``(gpus, driver, error)`` as ``nvidia-smi`` sees them, whatever ``CUDA_VISIBLE_DEVICES`` says.

    ``gpus`` is a list of names, or None when nvidia-smi is not installed; ``error`` is its message
    when it exists but fails (typically: no driver loaded).
    """
    exe = shutil.which('nvidia-smi')
    if exe is None:
        return None, None, None
    try:
        res = subprocess.run([exe, '--query-gpu=name,driver_version', '--format=csv,noheader'],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], None, str(e)
    if res.returncode != 0:
        lines = (res.stdout + res.stderr).strip().splitlines()
        return [], None, lines[0] if lines else f'exit status {res.returncode}'
    rows = [[f.strip() for f in line.split(',')] for line in res.stdout.splitlines() if line.strip()]
    return [r[0] for r in rows], (rows[0][1] if rows and len(rows[0]) > 1 else None), None


def probe_cuda(environ=None):
    """The facts :func:`cuda_problem` judges; nvidia-smi is only asked when torch sees no GPU."""
    environ = os.environ if environ is None else environ
    facts = dict(available=torch.cuda.is_available(), torch=torch.__version__, torch_cuda=torch.version.cuda,
                 visible_devices=environ.get('CUDA_VISIBLE_DEVICES'), gpus=None, driver=None, smi_error=None)
    facts['device_count'] = torch.cuda.device_count() if facts['available'] else 0
    if not facts['available']:
        facts['gpus'], facts['driver'], facts['smi_error'] = nvidia_smi_gpus()
    return facts


def cuda_problem(facts):
    """``None`` when CUDA is usable, else ``(cause, fix)`` in words, from :func:`probe_cuda`'s facts."""
    if facts['available']:
        return None
    if not facts['torch_cuda']:
        return (f"this torch build ({facts['torch']}) has no CUDA support",
                'install a CUDA build of torch: python3 tools/setup_env.py picks the one your driver runs '
                '(docs/install.md)')
    visible = facts.get('visible_devices')
    if visible is not None and visible.strip() in ('', '-1'):
        return (f'CUDA_VISIBLE_DEVICES is set to {visible!r}, which hides every GPU from this process',
                'unset CUDA_VISIBLE_DEVICES, or list the GPUs to use (e.g. CUDA_VISIBLE_DEVICES=0,1,2,3)')
    gpus = facts.get('gpus')
    if gpus:
        names = ', '.join(sorted(set(gpus)))
        driver = f", driver {facts['driver']}" if facts.get('driver') else ''
        also = (f'; or CUDA_VISIBLE_DEVICES={visible!r} names no existing GPU (nvidia-smi numbers them '
                f'0..{len(gpus) - 1})' if visible is not None else '')
        return (f"nvidia-smi lists {len(gpus)} GPU(s) ({names}{driver}) but torch {facts['torch']}, built for "
                f"CUDA {facts['torch_cuda']}, cannot use them (torch.cuda.is_available() is False): the NVIDIA "
                f'driver is older than this CUDA build needs, or does not match it{also}',
                'install the torch build for your driver (python3 tools/setup_env.py reads the driver version '
                'and picks it; the table "torch builds and NVIDIA drivers" in docs/install.md lists what each '
                'needs) or '
                'update the NVIDIA driver')
    if facts.get('smi_error'):
        return (f"no GPU is usable: nvidia-smi fails ({facts['smi_error']})",
                'the NVIDIA driver is not loaded or not installed on this machine; run on a GPU node')
    where = 'nvidia-smi lists no GPU' if gpus is not None else 'nvidia-smi is not installed'
    return (f'no GPU is visible: {where}',
            'run on a machine or in a job that has GPUs (with slurm: --gres=gpu:N, as tools/slurm_*.sh ask)')


def cuda_unusable_message(what, problem=None, cpu_option='--device cpu'):
    """The one line of a command that needs CUDA where it is not usable: ``what`` asked for a GPU, the cause and
    its fix (``problem``: :func:`cuda_problem`'s, probed here when not given) and how to ask for the CPU."""
    cause, fix = problem or cuda_problem(probe_cuda())
    return (f'{what}, but CUDA is not usable here: {cause}. Fix: {fix}. To run on the CPU on purpose, add '
            f'{cpu_option}.')


def check_device(launcher='none', device=None, environ=None, facts=None):
    """Decide the device of this run before anything is built; returns ``'cuda'`` or ``'cpu'``.

    * ``device`` (``--device``) or ``MMPOLA_DEVICE`` = ``cpu``: the CPU, asked for; the GPUs are
      hidden from this process (``CUDA_VISIBLE_DEVICES=''``; it only takes effect before CUDA is first
      asked, which importing mmengine does, so the tools set it in their bootstrap before torch loads).
    * otherwise, when CUDA is not usable (:func:`cuda_problem` names the cause): a launcher other
      than ``none`` (one process per GPU) or ``cuda`` asked for raises :class:`UserError` with the
      cause, its fix and how to ask for the CPU; a single process runs on the CPU after one
      ``WARNING`` line on stdout, where the run's log goes (stderr is kept for the tools' ``error:`` line).
    * with CUDA and a launcher, a local rank beyond the visible GPUs (8 processes, 4 GPUs) stops too.
    """
    environ = os.environ if environ is None else environ
    choice = requested_device(device, environ)
    if choice == 'cpu':
        environ['CUDA_VISIBLE_DEVICES'] = ''
        if torch.cuda.is_available():  # CUDA started before the GPUs could be hidden
            raise UserError('--device cpu could not hide the GPUs (CUDA was already queried in this process, '
                            'e.g. by importing mmengine); start the command with CUDA_VISIBLE_DEVICES= (empty)')
        return 'cpu'
    facts = probe_cuda(environ) if facts is None else facts
    problem = cuda_problem(facts)
    if problem is None:
        _check_local_rank(launcher, facts, environ)
        return 'cuda'
    cause, fix = problem
    if launcher != 'none' or choice == 'cuda':
        what = (f'--launcher {launcher} starts one process per GPU' if launcher != 'none'
                else f'--device cuda ({DEVICE_ENV}=cuda) asks for a GPU')
        raise UserError(cuda_unusable_message(what, problem, cpu_option=f'--device cpu (or set {DEVICE_ENV}=cpu)'))
    print(f'WARNING: running on the CPU: CUDA is not usable ({cause}). If a GPU was meant: {fix}. If the CPU is '
          f'meant, --device cpu (or {DEVICE_ENV}=cpu) says so and silences this warning.', flush=True)
    return 'cpu'


def device_option(tool_args):
    """The ``--device`` value among a tool's arguments (``--device cpu`` or ``--device=cpu``), or None."""
    for i, arg in enumerate(tool_args):
        if arg == '--device' and i + 1 < len(tool_args):
            return tool_args[i + 1]
        if arg.startswith('--device='):
            return arg.partition('=')[2]
    return None


def check_launch(nproc, tool_args=(), environ=None, facts=None):
    """What tools/dist_train.sh and dist_test.sh check once, before torchrun starts ``nproc`` processes
    on this machine (each would otherwise stop with the same error, followed by torchrun's failure report):
    CUDA is usable (:func:`check_device` of a ``pytorch`` launch) and shows at least ``nproc`` GPUs.
    Nothing is checked when the tool arguments or ``MMPOLA_DEVICE`` ask for the CPU."""
    environ = os.environ if environ is None else environ
    device = device_option(tool_args)
    if requested_device(device, environ) == 'cpu':
        return
    facts = probe_cuda(environ) if facts is None else facts
    check_device('pytorch', device, environ, facts)
    count = facts.get('device_count') or 0
    if nproc > count:
        raise UserError(f'{nproc} processes per machine (one per GPU) were asked for, but only {count} GPU(s) are '
                        f'visible on this machine (CUDA_VISIBLE_DEVICES={facts.get("visible_devices")!r}); start at '
                        f'most {count} (e.g. tools/dist_train.sh CONFIG {count})')


def _check_local_rank(launcher, facts, environ):
    """One process per GPU: a local rank without its GPU would fail in ``torch.cuda.set_device``."""
    if launcher == 'none':
        return
    local_rank = environ.get('LOCAL_RANK') or environ.get('SLURM_LOCALID')
    count = facts.get('device_count') or 0
    if local_rank is not None and local_rank.isdigit() and count and int(local_rank) >= count:
        raise UserError(f'--launcher {launcher}: this process has local rank {local_rank}, but only {count} GPU(s) '
                        f'are visible on this machine (CUDA_VISIBLE_DEVICES={facts.get("visible_devices")!r}); '
                        f'start at most {count} processes per machine (e.g. tools/dist_train.sh CONFIG {count}, '
                        'or GPUS_PER_NODE for tools/slurm_*.sh)')


# --------------------------------------------------------------------------------------------
# one check, one verdict for every rank

def end_distributed():
    """Leave the process group in order at the end of a distributed run (every rank waits for the
    others, then destroys it); nothing without one. Call it after dropping the Runner, so that its DDP
    model, data loaders and their workers are released while the group still exists: left to the
    interpreter's shutdown, gloo can abort the process (SIGABRT, "terminate called without an active
    exception") after the run's work is done, and the launcher reports the run as failed."""
    import gc

    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


def run_on_rank0_and_share(fn, *args, **kwargs):
    """Run ``fn`` on rank 0 only; every rank returns its result or raises its error.

    Without a process group (one process) this is ``fn(*args, **kwargs)``. With one, the other
    ranks wait for rank 0's verdict, so a check that reads many files (the data check) runs
    once, and an error it raises (an :class:`MMPolaUserError` with its message and exit status)
    is raised on every rank, which then leave the process group and exit the same way. Any other
    exception on rank 0 reaches the other ranks as a ``RuntimeError`` naming it.
    """
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return fn(*args, **kwargs)
    verdict = [None]
    error = None
    if dist.get_rank() == 0:
        try:
            verdict[0] = ('ok', fn(*args, **kwargs))
        except Exception as e:  # shared with the other ranks, then raised here too
            error = e
            verdict[0] = ('error', _shareable(e))
    dist.broadcast_object_list(verdict, src=0)
    kind, value = verdict[0]
    if kind == 'ok':
        return value
    dist.destroy_process_group()  # every rank stops here: leave the group cleanly
    if error is not None:
        raise error
    raise value


def _shareable(error):
    """``error`` itself if it survives pickling, else an equivalent that does."""
    if isinstance(error, MMPolaUserError):
        try:
            copy = pickle.loads(pickle.dumps(error))
            if str(copy) == str(error):
                return copy
        except Exception:
            pass
        shared = UserError(str(error))
        shared.exit_code = error.exit_code
        return shared
    return RuntimeError(f'rank 0 failed: {type(error).__name__}: {error}')
