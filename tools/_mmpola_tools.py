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

Everything after torch is loaded (config loading, checks, runner construction) lives in
:mod:`mmpola.runtime.cli`.
"""
import os
import os.path as osp
import sys

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

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)
