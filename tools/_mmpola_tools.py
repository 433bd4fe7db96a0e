"""The shared start of every script in tools/; each imports it before torch (or mmpola) is loaded.

* ``OMP_WAIT_POLICY=PASSIVE``: idle OpenMP threads sleep instead of spinning. On a CPU shared with
  other jobs, spinning threads wait for descheduled peers at every parallel region, which makes
  CPU training several times slower; idle machines barely notice. It only takes effect before
  torch loads OpenMP, hence here; an explicit ``OMP_WAIT_POLICY`` wins.
* ``--device cpu`` (or ``MMPOLA_DEVICE=cpu``) hides the GPUs (``CUDA_VISIBLE_DEVICES=''``) here,
  because importing mmengine already asks CUDA for its devices, after which the variable is read
  no more; :func:`mmpola.runtime.launch.check_device` then makes the choice and checks it took.
* the repository root goes on ``sys.path``, so the tools run from a plain checkout without
  ``pip install -e .``.
* run directly (``tools/train.py CONFIG``: the tools are executable, ``#!/usr/bin/env python3``) by a
  python without torch, a tool starts again with the repository's ``.venv`` when there is one (the
  environment ``tools/setup_env.py`` makes), as ``tools/dist_train.sh`` picks its python. A python
  with torch (your own environment, activated or named: ``/path/to/python tools/train.py``) is kept.

Everything after torch is loaded (config loading, checks, runner construction) lives in
:mod:`mmpola.runtime.cli`. Run as a script (``NPROC [tool options ...]``), it is tools/dist_*.sh's check before
torchrun starts the processes.
"""
import importlib.util
import os
import os.path as osp
import sys

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def _repo_venv_python():
    """The repository's .venv interpreter when this python lacks torch and that one exists, else None."""
    venv = osp.join(REPO_ROOT, '.venv')
    python = osp.join(venv, 'bin', 'python')
    if not osp.exists(python) or osp.realpath(sys.prefix) == osp.realpath(venv):
        return None
    return python if importlib.util.find_spec('torch') is None else None


_VENV_PYTHON = _repo_venv_python()
if _VENV_PYTHON is not None:
    os.execv(_VENV_PYTHON, [_VENV_PYTHON, osp.abspath(sys.argv[0])] + sys.argv[1:])

os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')


def _cpu_requested(argv):
    for i, arg in enumerate(argv):
        if arg == '--device' and i + 1 < len(argv):
            return argv[i + 1] == 'cpu'
        if arg.startswith('--device='):
            return arg.partition('=')[2] == 'cpu'
    return os.environ.get('MMPOLA_DEVICE') == 'cpu'


if _cpu_requested(sys.argv[1:]):
    os.environ['CUDA_VISIBLE_DEVICES'] = ''

if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)


if __name__ == '__main__':
    # ``NPROC [tool options ...]``: tools/dist_*.sh's check before torchrun
    # (:func:`mmpola.runtime.cli.check_launch_main`). Where the CPU is asked for it checks nothing but NPROC, so a
    # valid NPROC with ``--device cpu`` returns here, before mmpola (and torch) would take seconds to import.
    if not (sys.argv[1:] and sys.argv[1].isdecimal() and int(sys.argv[1]) >= 1 and _cpu_requested(sys.argv[2:])):
        from mmpola.runtime.cli import check_launch_main
        check_launch_main()
