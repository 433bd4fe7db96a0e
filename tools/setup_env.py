#!/usr/bin/env python3
"""Create (or refresh) mmpola's environment: one idempotent step, pins in requirements/pins.txt.

    python3 tools/setup_env.py                  # .venv in the repo (the README's commands call this)
    python3 tools/setup_env.py --python PY      # install into an existing env, keep its torch build
    python3 tools/setup_env.py --torch-index-url https://download.pytorch.org/whl/cu128

What it handles (measured traps, see DEVELOPERS.md):
* torch + torchvision are installed together with uv from the package registry. pip would prefer the
  machine's local CPU-only torch wheel and pair it with the registry's CUDA torchvision, which then
  fails to import ("operator torchvision::nms does not exist").
* mmcv 2.1.0 has no wheel for modern torch: it is built once from its sdist with compiled ops
  (CPU ops, or CUDA ops when a GPU and nvcc are present) using --no-build-isolation and
  setuptools < 81 (its setup.py needs pkg_resources). The wheel is kept in a wheelhouse outside
  the clone, keyed by mmcv/torch/CUDA/python versions, so later set-ups take seconds.
* mmseg 1.2.2 imports ftfy and regex without declaring them: they are pinned here.
Only the standard library is used, so the system python3 can run it before any env exists.
"""
import argparse
import hashlib
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import tempfile
import time

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
PINS_FILE = osp.join(REPO, 'requirements', 'pins.txt')
STAMP_NAME = 'mmpola-setup.json'
DEFAULT_WHEELHOUSE = osp.join(osp.expanduser('~'), '.cache', 'mmpola', 'wheelhouse')
# what the env must import at the end; also the quick check of an up-to-date env
CHECK_CODE = r'''
import json, torch, torchvision, mmcv, mmengine, mmdet, mmseg, timm, einops, pycocotools, mmpola
from mmcv.ops import nms, RoIAlign  # compiled ops present
from torchvision.ops import nms as tv_nms
b = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.]]); s = torch.tensor([0.9, 0.8])
assert nms(b, s, 0.5)[1].tolist() == [0] and tv_nms(b, s, 0.5).tolist() == [0]
print(json.dumps({
    'python': __import__('platform').python_version(), 'torch': torch.__version__,
    'cuda': torch.version.cuda, 'gpu': torch.cuda.is_available(),
    'torchvision': torchvision.__version__, 'mmengine': mmengine.__version__,
    'mmcv': mmcv.__version__, 'mmdet': mmdet.__version__, 'mmseg': mmseg.__version__,
    'timm': timm.__version__, 'mmpola': mmpola.__version__}))
'''


def log(msg):
    print(f'[setup] {msg}', flush=True)


def fail(msg):
    print(f'[setup] ERROR: {msg}', file=sys.stderr, flush=True)
    sys.exit(1)


def run(cmd, env=None, quiet=False):
    log('$ ' + ' '.join(cmd))
    res = subprocess.run(cmd, env=env, stdout=subprocess.PIPE if quiet else None,
                         stderr=subprocess.STDOUT if quiet else None, text=True)
    if res.returncode != 0:
        if quiet and res.stdout:
            print(res.stdout[-6000:], file=sys.stderr)
        fail(f'command failed with exit code {res.returncode}: {" ".join(cmd)}')
    return res


def read_pins():
    pins = {}
    with open(PINS_FILE) as f:
        for line in f:
            line = line.split('#', 1)[0].strip()
            if not line:
                continue
            name, _, version = line.partition('==')
            pins[name.strip().lower()] = version.strip()
    return pins


def spec(pins, name):
    version = pins[name]
    return f'{name}=={version}' if version else name


def fingerprint():
    h = hashlib.sha256()
    for path in (PINS_FILE, osp.join(REPO, 'setup.py'), osp.abspath(__file__)):
        with open(path, 'rb') as f:
            h.update(f.read())
    return h.hexdigest()[:16]


def py_info(python, code):
    res = subprocess.run([python, '-c', code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    return res.returncode, res.stdout.strip(), res.stderr.strip()


def ensure_uv(python, pins):
    code, _, _ = py_info(python, 'import uv')
    if code != 0:
        run([python, '-m', 'pip', 'install', '--quiet', spec(pins, 'uv')])
    code, out, _ = py_info(python, 'import uv; print(uv.find_uv_bin())')
    if code != 0:
        fail('could not install uv into the environment (pip install uv failed)')
    return out


def uv_install(uv, python, args, extra_env=None):
    env = dict(os.environ)
    env.update(extra_env or {})
    run([uv, 'pip', 'install', '--python', python] + args, env=env)


def torch_pair(python):
    code, out, err = py_info(
        python, 'import json, torch, torchvision; from torchvision.ops import nms; '
        'from importlib.metadata import version; '
        'print(json.dumps([torch.__version__, torchvision.__version__, torch.version.cuda, '
        'torch.cuda.is_available(), version("torch"), version("torchvision")]))')
    if code != 0:
        return None, err.splitlines()[-1] if err else 'import failed'
    return json.loads(out), None


def nvcc_available():
    cuda_home = os.environ.get('CUDA_HOME') or os.environ.get('CUDA_PATH')
    if cuda_home and osp.exists(osp.join(cuda_home, 'bin', 'nvcc')):
        return True
    return shutil.which('nvcc') is not None


def mmcv_wheel(python, pins, torch_info, wheelhouse):
    """Return a path to an mmcv wheel built for this torch, building it once if needed."""
    torch_version, _, cuda, gpu = torch_info[:4]
    ops = os.environ.get('MMPOLA_MMCV_OPS') or ('cuda' if gpu and nvcc_available() else 'cpu')
    if ops not in ('cpu', 'cuda'):
        fail(f"MMPOLA_MMCV_OPS must be 'cpu' or 'cuda', got {ops!r}")
    _, pyver, _ = py_info(python, 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
    key = (f"mmcv-{pins['mmcv']}_torch-{torch_version.replace('+', '-')}_"
           f"cuda-{cuda or 'none'}_ops-{ops}_py{pyver}")
    folder = osp.join(wheelhouse, key)
    wheels = sorted(f for f in os.listdir(folder) if f.endswith('.whl')) if osp.isdir(folder) else []
    if wheels:
        log(f'mmcv: using cached wheel {osp.join(folder, wheels[-1])}')
        return osp.join(folder, wheels[-1])
    log(f'mmcv: no cached wheel for {key}; building mmcv {pins["mmcv"]} with {ops.upper()} ops '
        '(one time, about 10-15 minutes on 2 cores)')
    env = dict(os.environ, MMCV_WITH_OPS='1', FORCE_CUDA='1' if ops == 'cuda' else '0',
               MAX_JOBS=os.environ.get('MAX_JOBS', str(os.cpu_count() or 2)))
    if ops == 'cpu':
        env['CUDA_VISIBLE_DEVICES'] = ''  # keep setup.py from picking CUDA extensions
    env.pop('PIP_FIND_LINKS', None)
    os.makedirs(wheelhouse, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix='mmcv-build-', dir=wheelhouse)
    start = time.time()
    try:
        run([python, '-m', 'pip', 'wheel', '--no-build-isolation', '--no-deps',
             f'mmcv=={pins["mmcv"]}', '-w', tmp], env=env)
        built = [f for f in os.listdir(tmp) if f.endswith('.whl')]
        if not built:
            fail('pip wheel produced no mmcv wheel')
        os.makedirs(folder, exist_ok=True)
        shutil.move(osp.join(tmp, built[0]), osp.join(folder, built[0]))  # atomic on one fs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f'mmcv: built in {time.time() - start:.0f} s -> {folder}')
    return osp.join(folder, built[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--venv', default=os.environ.get('MMPOLA_VENV', osp.join(REPO, '.venv')),
                        help='virtual environment to create/update (default: .venv in the repo)')
    parser.add_argument('--python', default=None,
                        help='install into this existing interpreter instead of a venv; its '
                        'torch/torchvision build (e.g. your CUDA build) is kept as it is')
    parser.add_argument('--torch-index-url', default=os.environ.get('MMPOLA_TORCH_INDEX_URL'),
                        help='index for torch/torchvision (e.g. a specific CUDA build)')
    parser.add_argument('--wheelhouse', default=os.environ.get('MMPOLA_WHEELHOUSE', DEFAULT_WHEELHOUSE),
                        help='where built mmcv wheels are kept (outside the clone)')
    parser.add_argument('--force', action='store_true', help='reinstall even if up to date')
    args = parser.parse_args()
    start = time.time()
    pins = read_pins()

    if args.python:
        python = args.python
        prefix_code, prefix, _ = py_info(python, 'import sys; print(sys.prefix)')
        if prefix_code != 0:
            fail(f'--python {python!r} is not a working Python interpreter')
    else:
        if sys.version_info < (3, 8):
            fail('Python >= 3.8 is needed to create the environment')
        python = osp.join(args.venv, 'bin', 'python')
        prefix = args.venv
        if not osp.exists(python):
            log(f'creating virtual environment {args.venv}')
            run([sys.executable, '-m', 'venv', args.venv])

    stamp_path = osp.join(prefix, STAMP_NAME)
    want = fingerprint()
    if not args.force and osp.exists(stamp_path):
        with open(stamp_path) as f:
            stamp = json.load(f)
        if stamp.get('fingerprint') == want and stamp.get('repo') == REPO:
            code, out, err = py_info(python, CHECK_CODE)
            if code == 0:
                log(f'environment is up to date ({prefix}); checked in {time.time() - start:.1f} s')
                return
            log('environment stamp is current but the import check failed; repairing:\n' + err[-800:])

    uv = ensure_uv(python, pins)

    # 1. torch + torchvision: a matching pair from one source
    if args.python:
        info, err = torch_pair(python)
        if info is None:
            fail(f'--python mode keeps your torch build, but torch/torchvision do not import '
                 f'together in {python}: {err}. Install a matching pair first (see README).')
        log(f'keeping torch {info[0]} / torchvision {info[1]} (CUDA {info[2]})')
    else:
        torch_args = [spec(pins, 'torch'), spec(pins, 'torchvision')]
        if args.torch_index_url:
            torch_args += ['--index-url', args.torch_index_url]
        uv_install(uv, python, torch_args)
        info, err = torch_pair(python)
        if info is None:
            fail(f'torch and torchvision do not import together: {err}. They must be from the same '
                 'release train and build (see DEVELOPERS.md, "torch / torchvision").')
    # pin what is installed (distribution versions, which may lack the '+cu130' label that
    # torch.__version__ shows) so later installs never swap torch underneath the mmcv build
    constraints = osp.join(prefix, 'mmpola-torch-constraints.txt')
    with open(constraints, 'w') as f:
        f.write(f'torch=={info[4]}\ntorchvision=={info[5]}\n')

    # 2. mmcv's build requirements, then the mmcv wheel (cached)
    build_reqs = [spec(pins, n) for n in ('setuptools', 'wheel', 'ninja', 'numpy',
                                          'opencv-python', 'opencv-python-headless')]
    uv_install(uv, python, build_reqs + ['-c', constraints])
    wheel = mmcv_wheel(python, pins, info, args.wheelhouse)

    # 3. the rest of the stack and mmpola itself (editable)
    stack = [wheel] + [spec(pins, n) for n in (
        'mmengine', 'mmdet', 'mmsegmentation', 'ftfy', 'regex', 'timm', 'einops', 'pycocotools',
        'numpy', 'opencv-python', 'opencv-python-headless', 'setuptools', 'pytest', 'ruff')]
    uv_install(uv, python, stack + ['-c', constraints])
    uv_install(uv, python, ['--no-deps', '-e', REPO])

    code, out, err = py_info(python, CHECK_CODE)
    if code != 0:
        fail('the environment does not import cleanly:\n' + err[-3000:])
    versions = json.loads(out)
    with open(stamp_path, 'w') as f:
        json.dump(dict(fingerprint=want, repo=REPO, versions=versions, mmcv_wheel=wheel), f, indent=1)
    log('ready in %.0f s: %s' % (time.time() - start, ', '.join(f'{k} {v}' for k, v in versions.items())))


if __name__ == '__main__':
    main()
