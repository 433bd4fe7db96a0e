#!/usr/bin/env python3
"""Create (or refresh) mmpola's environment: one idempotent step, pins in requirements/pins.txt (what
mmpola runs and builds with) and requirements/dev.txt (pytest, pytest-xdist, ruff, uv).

    tools/setup_env.py                  # .venv in the repo (the README's commands call this)
    tools/setup_env.py --python PY      # install into an existing env, keep its torch build
    tools/setup_env.py --torch-index-url https://download.pytorch.org/whl/cu128

What it handles (measured traps, see DEVELOPERS.md):
* torch + torchvision are installed together with uv from the package registry. pip would prefer the
  machine's local CPU-only torch wheel and pair it with the registry's CUDA torchvision, which then
  fails to import ("operator torchvision::nms does not exist").
* mmcv 2.1.0 has no wheel for modern torch: it is built once from its sdist with compiled ops
  using --no-build-isolation and setuptools < 81 (its setup.py needs pkg_resources). CUDA ops
  whenever nvcc and a CUDA torch are present on a GPU machine (a GPU visible, nvidia-smi installed,
  or TORCH_CUDA_ARCH_LIST set, as on a login node), else CPU ops; MMPOLA_MMCV_OPS=cpu|cuda
  overrides. nvcc's CUDA major version must be torch's.
  The wheel is kept in a wheelhouse outside the clone, keyed by mmcv/torch/CUDA/ops/arch
  list/python, so later set-ups take seconds.
* GPU machines (nvidia-smi): the default torch build must run on the driver (else the build
  for an older CUDA is picked, saying so), and an environment counts as up to date only when
  torch sees the GPU and mmcv's CUDA kernels run on it.
* --python: torch must be at least the oldest mmpola is tested with (mmpola/version.py); packages
  of that environment are changed only after listing the changes (--yes to accept them).
* mmseg 1.2.2 imports ftfy and regex without declaring them: they are pinned here.
* one OpenCV distribution: opencv-python (mmengine's requirement). opencv-python-headless writes the
  same cv2 files; an environment set up before holds both, and the set-up removes the other one.
Only the standard library is used, so the system python3 can run it before any env exists.
The decisions are functions of the probed facts (tests call them with made-up machines).
"""
import argparse
import hashlib
import json
import os
import os.path as osp
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
import time

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
PINS_FILE = osp.join(REPO, 'requirements', 'pins.txt')
DEV_FILE = osp.join(REPO, 'requirements', 'dev.txt')
# other distributions of OpenCV's cv2 module: installed beside opencv-python, they overwrite its files
OTHER_OPENCV = ('opencv-python-headless', 'opencv-contrib-python', 'opencv-contrib-python-headless')
STAMP_NAME = 'mmpola-setup.json'
DEFAULT_WHEELHOUSE = osp.join(osp.expanduser('~'), '.cache', 'mmpola', 'wheelhouse')
# what the env must import at the end; also the quick check of an up-to-date env. With a usable
# GPU it also runs mmcv's CUDA nms there (a CPU-ops build, or one without kernels for this GPU,
# is then told apart from a working one by env_fit_problem).
CHECK_CODE = r'''
import json, torch, torchvision, mmcv, mmengine, mmdet, mmseg, timm, pycocotools, cv2, mmpola
from mmcv.ops import nms, RoIAlign, get_compiling_cuda_version  # compiled ops present
from torchvision.ops import nms as tv_nms
b = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.]]); s = torch.tensor([0.9, 0.8])
assert nms(b, s, 0.5)[1].tolist() == [0] and tv_nms(b, s, 0.5).tolist() == [0]
mmcv_cuda = get_compiling_cuda_version()  # 'not available' for CPU ops
cuda_ops_error = None
if torch.cuda.is_available() and mmcv_cuda != 'not available':
    try:
        assert nms(b.cuda(), s.cuda(), 0.5)[1].tolist() == [0], 'wrong result'
    except Exception as e:
        cuda_ops_error = (f'{type(e).__name__}: {e}'.strip().splitlines() or [''])[0]
print(json.dumps({
    'python': __import__('platform').python_version(), 'torch': torch.__version__,
    'cuda': torch.version.cuda, 'gpu': torch.cuda.is_available(),
    'torchvision': torchvision.__version__, 'mmengine': mmengine.__version__,
    'mmcv': mmcv.__version__, 'mmcv_ops': 'cpu' if mmcv_cuda == 'not available' else 'cuda',
    'mmcv_cuda': mmcv_cuda, 'cuda_ops_error': cuda_ops_error, 'mmdet': mmdet.__version__,
    'mmseg': mmseg.__version__, 'timm': timm.__version__, 'mmpola': mmpola.__version__}))
'''
# The package registry's build of the pinned torch is for this CUDA version; the PyTorch index has
# builds for older CUDA versions too (newest first), for machines whose driver is older. A build
# runs on a driver of at least the minimum of its CUDA major version (CUDA minor version
# compatibility). docs/install.md, "torch builds and NVIDIA drivers", says the same for users.
DEFAULT_TORCH_CUDA = '13.0'
TORCH_INDEX = 'https://download.pytorch.org/whl/'
TORCH_CUDA_BUILDS = ('13.0', '12.8', '12.6')
MIN_DRIVER = {13: '580.65.06', 12: '525.60.13', 11: '450.80.02'}
# the oldest torch mmpola is tested with, and its check (mmpola/version.py: the standard library only)
_VERSION = runpy.run_path(osp.join(REPO, 'mmpola', 'version.py'))
MIN_TORCH, torch_too_old = _VERSION['MIN_TORCH'], _VERSION['torch_too_old']
# GPU architectures mmcv's CUDA ops are built for when TORCH_CUDA_ARCH_LIST is unset and no GPU is
# visible (a login node): V100 (7.0; dropped by CUDA 13), T4, A100, A10/RTX 30, L4/RTX 40, H100,
# B200 and RTX 50 (10.0, 12.0; from CUDA 12.8), plus PTX of the newest for later GPUs.
DEFAULT_ARCHS = ('7.0', '7.5', '8.0', '8.6', '8.9', '9.0', '10.0', '12.0')


class SetupError(Exception):
    """A decision that stops the set-up; the message names the problem and the fix."""


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


def read_pins(paths=(PINS_FILE, DEV_FILE)):
    """name -> pinned version ('' when unpinned) from requirements/pins.txt and requirements/dev.txt."""
    pins = {}
    for path in paths:
        with open(path) as f:
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
    for path in (PINS_FILE, DEV_FILE, osp.join(REPO, 'pyproject.toml'), osp.join(REPO, 'setup.py'),
                 osp.abspath(__file__)):
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
    """``uv pip install`` into ``python``'s environment. ``--compile-bytecode``: uv writes no .pyc files by
    default (pip does), and where Python may not write them either (PYTHONDONTWRITEBYTECODE, read-only
    installs) every process would compile torch, mmengine and mmdet from source at each start."""
    env = dict(os.environ)
    env.update(extra_env or {})
    run([uv, 'pip', 'install', '--python', python, '--compile-bytecode'] + args, env=env)


def torch_pair(python):
    code, out, err = py_info(
        python, 'import json, torch, torchvision; from torchvision.ops import nms; '
        'from importlib.metadata import version; '
        'print(json.dumps([torch.__version__, torchvision.__version__, torch.version.cuda, '
        'torch.cuda.is_available(), version("torch"), version("torchvision")]))')
    if code != 0:
        return None, err.splitlines()[-1] if err else 'import failed'
    return json.loads(out), None


# --------------------------------------------------------------------------------------------
# what the machine has (probes; each returns plain facts)

def find_nvcc():
    """The nvcc torch's extension builder will use: $CUDA_HOME / $CUDA_PATH, PATH, /usr/local/cuda."""
    cuda_home = os.environ.get('CUDA_HOME') or os.environ.get('CUDA_PATH')
    if cuda_home:
        path = osp.join(cuda_home, 'bin', 'nvcc')
        return path if osp.exists(path) else None
    found = shutil.which('nvcc')
    if found:
        return found
    return '/usr/local/cuda/bin/nvcc' if osp.exists('/usr/local/cuda/bin/nvcc') else None


def probe_nvcc():
    """``(path, CUDA version such as '12.8')``; ``(None, None)`` without nvcc."""
    path = find_nvcc()
    if path is None:
        return None, None
    try:
        out = subprocess.run([path, '--version'], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return path, None
    return path, parse_nvcc_version(out)


def nvidia_smi():
    return shutil.which('nvidia-smi')


def probe_gpus():
    """``(gpus, error)`` from nvidia-smi: dicts with name, compute_cap (None on old drivers), driver."""
    exe = nvidia_smi()
    if exe is None:
        return [], None
    for fields in ('name,compute_cap,driver_version', 'name,driver_version'):
        try:
            res = subprocess.run([exe, f'--query-gpu={fields}', '--format=csv,noheader'],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            return [], str(e)
        if res.returncode == 0:
            return parse_gpus(res.stdout, with_compute_cap=fields.count(',') == 2), None
    return [], (res.stdout.strip().splitlines() or [f'exit status {res.returncode}'])[0]


# --------------------------------------------------------------------------------------------
# decisions: functions of the probed facts only

def version_tuple(text):
    """'2.3.1+cu121' -> (2, 3, 1); '525.60.13' -> (525, 60, 13)."""
    return tuple(int(x) for x in re.findall(r'\d+', text.split('+')[0])[:3])


def parse_nvcc_version(text):
    """'... Cuda compilation tools, release 12.8, V12.8.93' -> '12.8'."""
    found = re.search(r'release (\d+)\.(\d+)', text)
    return f'{found.group(1)}.{found.group(2)}' if found else None


def parse_gpus(text, with_compute_cap=True):
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(',')]
        if not line.strip() or len(fields) < 2:
            continue
        cap = fields[1] if with_compute_cap and re.fullmatch(r'\d+\.\d+', fields[1]) else None
        gpus.append(dict(name=fields[0], compute_cap=cap, driver=fields[-1]))
    return gpus


def describe_gpus(gpus):
    names = ', '.join(sorted({g['name'] for g in gpus}))
    caps = sorted({g['compute_cap'] for g in gpus if g.get('compute_cap')}, key=version_tuple)
    return f"{len(gpus)} x {names}" + (f" (compute capability {', '.join(caps)})" if caps else '')


def decide_mmcv_ops(override, torch_cuda, nvcc_version, gpus=(), gpu_machine=False):
    """'cuda' or 'cpu': the kind of compiled ops mmcv is built with. ``override`` is ``MMPOLA_MMCV_OPS``.

    CUDA ops need nvcc and a CUDA torch, and are built whenever both are present on a machine meant
    for GPUs, whether or not a GPU is visible: ``gpus`` (visible ones) or ``gpu_machine`` (nvidia-smi
    is installed, or TORCH_CUDA_ARCH_LIST names the GPUs to build for, as on a login node). A machine
    with neither gets CPU ops: the project's CPU machines (CI's too) carry a CUDA torch *and* a CUDA
    toolkit, and a CUDA build there would take hours on 2 cores for GPUs that are not there. On a
    machine with a GPU, CPU ops are not chosen silently: mmcv's detection ops fail on CUDA tensors.
    """
    if override:
        if override not in ('cpu', 'cuda'):
            raise SetupError(f"MMPOLA_MMCV_OPS must be 'cpu' or 'cuda', got {override!r}")
        if override == 'cuda' and not torch_cuda:
            raise SetupError('MMPOLA_MMCV_OPS=cuda, but the torch of this environment is a CPU build; install '
                             'a CUDA build (--torch-index-url, see docs/install.md) or build CPU ops '
                             '(MMPOLA_MMCV_OPS=cpu)')
        if override == 'cuda' and not nvcc_version:
            raise SetupError('MMPOLA_MMCV_OPS=cuda, but nvcc was not found (CUDA_HOME, PATH, /usr/local/cuda); '
                             f'install the CUDA {torch_cuda} toolkit or point CUDA_HOME at it')
        return override
    if torch_cuda and nvcc_version and (gpus or gpu_machine):
        return 'cuda'
    if gpus and torch_cuda:
        raise SetupError(
            f'this machine has {describe_gpus(gpus)}, but nvcc was not found (CUDA_HOME, PATH, /usr/local/cuda), '
            "so mmcv could only be built with CPU ops, which fail on CUDA tensors (mmdet's RoIAlign, nms). Install "
            f'the CUDA {torch_cuda.split(".")[0]}.x toolkit (or point CUDA_HOME at it) and re-run; to build CPU ops '
            'anyway, set MMPOLA_MMCV_OPS=cpu')
    return 'cpu'


def default_arch_list(nvcc_version):
    """DEFAULT_ARCHS that this nvcc can compile, the newest also as PTX (runs on later GPUs)."""
    cuda = version_tuple(nvcc_version or '12.0')
    archs = [a for a in DEFAULT_ARCHS if not (cuda >= (13,) and version_tuple(a) < (7, 5))  # CUDA 13 dropped Volta
             and not (cuda < (12, 8) and version_tuple(a) >= (10,))]  # Blackwell came with CUDA 12.8
    return ';'.join(archs) + '+PTX'


def decide_arch_list(env_value, gpus, nvcc_version):
    """``(TORCH_CUDA_ARCH_LIST for the build, where it came from)``: the variable, the visible GPUs
    or the default list."""
    if env_value and env_value.strip():
        return ';'.join(env_value.replace(',', ';').replace(' ', ';').split(';')).strip(';'), 'TORCH_CUDA_ARCH_LIST'
    caps = sorted({g['compute_cap'] for g in gpus if g.get('compute_cap')}, key=version_tuple)
    if caps:
        return ';'.join(caps), 'the visible GPU(s)'
    return default_arch_list(nvcc_version), 'the default list (no GPU visible; set TORCH_CUDA_ARCH_LIST to change it)'


def check_nvcc_matches_torch(nvcc_path, nvcc_version, torch_version, torch_cuda):
    """CUDA ops are compiled by nvcc against torch's CUDA: their major versions must be equal."""
    if nvcc_version is None:
        raise SetupError(f'could not read the CUDA version of {nvcc_path} (`{nvcc_path} --version`); point '
                         'CUDA_HOME at a working CUDA toolkit, or build CPU ops (MMPOLA_MMCV_OPS=cpu)')
    if version_tuple(nvcc_version)[:1] != version_tuple(torch_cuda)[:1]:
        major = torch_cuda.split('.')[0]
        builds = [c for c in TORCH_CUDA_BUILDS if c.split('.')[0] == nvcc_version.split('.')[0]]
        other = (f'install the torch build for CUDA {builds[0]} (--torch-index-url {torch_index_url(builds[0])})'
                 if builds else f'no torch {torch_version.split("+")[0]} build is offered for CUDA {nvcc_version}')
        raise SetupError(
            f'nvcc {nvcc_path} is CUDA {nvcc_version}, but torch {torch_version} was built with CUDA {torch_cuda}: '
            "mmcv's CUDA ops must be compiled with the same CUDA major version, and the build (about 20 minutes) "
            f'would fail or load wrongly. Fix: install a CUDA {major}.x toolkit and put it first (export '
            f'CUDA_HOME=/usr/local/cuda-{major}.x PATH=$CUDA_HOME/bin:$PATH), or {other}, or build CPU ops only '
            '(MMPOLA_MMCV_OPS=cpu)')


def arch_tag(arch_list):
    return '-'.join(a for a in arch_list.split(';') if a)


def wheel_key(mmcv, torch_version, cuda, ops, pyver, arch_list=None):
    """The wheelhouse folder of one mmcv build: mmcv/torch/CUDA versions, ops kind, arch list (CUDA ops), python."""
    key = f"mmcv-{mmcv}_torch-{torch_version.replace('+', '-')}_cuda-{cuda or 'none'}_ops-{ops}"
    if ops == 'cuda':
        key += f'_arch-{arch_tag(arch_list)}'
    return f'{key}_py{pyver}'


def torch_index_url(cuda):
    return f"{TORCH_INDEX}cu{cuda.replace('.', '')}"


def index_cuda(url):
    """The CUDA version of a PyTorch index URL ('.../cu128' -> '12.8'), 'cpu', or None if unknown."""
    found = re.search(r'/(cu(\d+)(\d)|cpu)/?$', url or '')
    if not found:
        return None
    return 'cpu' if found.group(1) == 'cpu' else f'{found.group(2)}.{found.group(3)}'


def min_driver(cuda):
    return MIN_DRIVER.get(version_tuple(cuda)[0])


def driver_runs(driver, cuda):
    needed = min_driver(cuda)
    return needed is None or version_tuple(driver) >= version_tuple(needed)


def choose_torch_index(driver, requested_url, torch_pin, accept=False):
    """``(index URL or None for the registry's build, message to log or None)`` for the venv's torch.

    ``driver`` is nvidia-smi's driver version (None: no GPU, nothing to check). When the driver is too old
    for the default build, the newest build it runs is picked and said; a requested index the driver
    cannot run stops the set-up (``accept``: go on, warning).
    """
    if driver is None:
        return requested_url, None
    if requested_url:
        cuda = index_cuda(requested_url)
        if cuda in (None, 'cpu') or driver_runs(driver, cuda):
            return requested_url, None
        fits = [c for c in TORCH_CUDA_BUILDS if driver_runs(driver, c)]
        hint = f'--torch-index-url {torch_index_url(fits[0])}' if fits else 'an NVIDIA driver update'
        msg = (f'--torch-index-url {requested_url} is a CUDA {cuda} build, which needs NVIDIA driver >= '
               f'{min_driver(cuda)}; this machine has driver {driver}, so torch would not see its GPUs. '
               f'Use {hint}, or update the driver')
        if not accept:
            raise SetupError(msg + ' (--yes installs it anyway)')
        return requested_url, 'WARNING: ' + msg
    if driver_runs(driver, DEFAULT_TORCH_CUDA):
        return None, None
    for cuda in TORCH_CUDA_BUILDS:
        if driver_runs(driver, cuda):
            url = torch_index_url(cuda)
            return url, (f'NVIDIA driver {driver} is too old for the default torch {torch_pin} build (CUDA '
                         f'{DEFAULT_TORCH_CUDA} needs driver >= {min_driver(DEFAULT_TORCH_CUDA)}): installing its '
                         f'CUDA {cuda} build from {url} instead (another one: --torch-index-url; or update the driver)')
    raise SetupError(f'NVIDIA driver {driver} is too old for every CUDA build of torch {torch_pin} (the oldest, CUDA '
                     f'{TORCH_CUDA_BUILDS[-1]}, needs driver >= {min_driver(TORCH_CUDA_BUILDS[-1])}). Update the '
                     f'driver, or install the CPU build: --torch-index-url {TORCH_INDEX}cpu')


def wanted_torch_cuda(index_url):
    """The CUDA version of the torch build an index gives (None: CPU build or unknown index)."""
    if not index_url:
        return DEFAULT_TORCH_CUDA
    cuda = index_cuda(index_url)
    return None if cuda in (None, 'cpu') else cuda


def check_user_torch(torch_version, python):
    problem = torch_too_old(torch_version)
    if problem:
        raise SetupError(f'in {python}: {problem}; or leave out --python to let the set-up create .venv with the '
                         'pinned torch')


def torch_fit_problem(torch_version, cuda, gpu, gpus):
    """Why a CUDA torch does not use this machine's GPUs (None: it does, or there are none)."""
    if not gpus or not cuda or gpu:
        return None
    driver = gpus[0].get('driver')
    why = (f'the NVIDIA driver {driver} is older than a CUDA {cuda} build needs (>= {min_driver(cuda)}); install '
           'the torch build for this driver (docs/install.md, "torch builds and NVIDIA drivers") or update the driver'
           if not driver_runs(driver, cuda) else
           f'driver {driver} should run it; check that `nvidia-smi` works and that CUDA_VISIBLE_DEVICES does not '
           'hide the GPUs')
    return f"torch {torch_version} (CUDA {cuda}) cannot use this machine's {describe_gpus(gpus)}: {why}"


def env_fit_problem(report, gpus, ops_override=None):
    """Why an environment that imports does not suit this machine (None: it does).

    ``report`` is CHECK_CODE's output. Without a GPU (or with a CPU build of torch, which only an
    explicit choice installs) any working build suits. Otherwise a CUDA torch must see the GPU and
    mmcv must have CUDA ops whose kernels run on it (unless MMPOLA_MMCV_OPS=cpu).
    """
    if not gpus or not report.get('cuda'):  # no GPU, or a CPU build of torch chosen on purpose
        return None
    problem = torch_fit_problem(report.get('torch'), report.get('cuda'), report.get('gpu'), gpus)
    if problem:
        return problem
    if ops_override == 'cpu':
        return None
    if report.get('mmcv_ops') != 'cuda':
        return f"mmcv {report.get('mmcv')} was built with CPU ops only, and this machine has {describe_gpus(gpus)}"
    if report.get('cuda_ops_error'):
        return (f"mmcv's CUDA kernels do not run on this machine's {describe_gpus(gpus)}: "
                f"{report['cuda_ops_error']} (TORCH_CUDA_ARCH_LIST must include the GPU's compute capability)")
    return None


def normalize_name(name):
    return re.sub(r'[-_.]+', '-', name).lower()


def planned_changes(pip_report, installed):
    """``(changed, added)`` from ``pip install --dry-run --report``: ``changed`` lists
    ``(name, installed version, new version)`` of packages already in the environment."""
    changed, added = [], []
    for item in pip_report.get('install', []):
        name, version = item['metadata']['name'], item['metadata']['version']
        old = installed.get(normalize_name(name))
        if old is None:
            added.append(f'{name} {version}')
        elif old != version:
            changed.append((name, old, version))
    return changed, added


def other_opencv(installed):
    """The OpenCV distributions in ``installed`` (normalised name -> version) besides opencv-python."""
    return [name for name in OTHER_OPENCV if normalize_name(name) in installed]


def installed_distributions(python):
    """normalised name -> version of every distribution of ``python``'s environment ({} if unknown)."""
    code, out, _ = py_info(python, 'import json, importlib.metadata as m; '
                           'print(json.dumps({d.metadata["Name"]: d.version for d in m.distributions()}))')
    try:
        found = json.loads(out) if code == 0 else {}
    except ValueError:
        found = {}
    return {normalize_name(k): v for k, v in found.items()} if isinstance(found, dict) else {}


def format_changes(changed):
    return ', '.join(f"{name} {old} -> {new} ({'downgrade' if version_tuple(new) < version_tuple(old) else 'upgrade'})"
                     for name, old, new in changed)


# --------------------------------------------------------------------------------------------
# the steps

def review_changes(python, specs, constraints, accept):
    """--python: say which packages of the user's environment the set-up would change; stop unless ``accept``."""
    installed = installed_distributions(python)
    with tempfile.TemporaryDirectory(prefix='mmpola-dry-run-') as tmp:
        report_path = osp.join(tmp, 'report.json')
        res = subprocess.run([python, '-m', 'pip', 'install', '--dry-run', '--quiet', '--report', report_path,
                              '-c', constraints] + specs, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if res.returncode != 0 or not osp.exists(report_path):
            why = (res.stdout.strip().splitlines() or ['no report'])[-1]
            if accept:
                log(f'could not list the changes in advance ({why}); going on (--yes)')
                return
            raise SetupError(f'could not list what the set-up would change in {python} with `pip install --dry-run '
                             f'--report` ({why}; pip >= 22.2 is needed). Update pip there, or re-run with --yes to '
                             'install without the list')
        with open(report_path) as f:
            changed, added = planned_changes(json.load(f), installed)
    if added:
        log(f'would add to {python}: {", ".join(added)}')
    if changed and not accept:
        raise SetupError(f'the set-up would change {len(changed)} package(s) of the environment of {python}: '
                         f'{format_changes(changed)}. These are the versions mmpola is tested with '
                         '(requirements/pins.txt). Re-run with --yes to accept, or use a separate environment '
                         '(leave out --python to get .venv)')
    if changed:
        log(f'changing (--yes): {format_changes(changed)}')


def mmcv_wheel(python, pins, torch_version, cuda, ops, arch_list, wheelhouse):
    """Return a path to an mmcv wheel built for this torch, building it once if needed."""
    _, pyver, _ = py_info(python, 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
    key = wheel_key(pins['mmcv'], torch_version, cuda, ops, pyver, arch_list)
    folder = osp.join(wheelhouse, key)
    wheels = sorted(f for f in os.listdir(folder) if f.endswith('.whl')) if osp.isdir(folder) else []
    if wheels:
        log(f'mmcv: using cached wheel {osp.join(folder, wheels[-1])}')
        return osp.join(folder, wheels[-1])
    log(f'mmcv: no cached wheel for {key}; building mmcv {pins["mmcv"]} with {ops.upper()} ops '
        '(one time, about 10-15 minutes on 2 cores for CPU ops; CUDA ops take longer per architecture)')
    env = dict(os.environ, MMCV_WITH_OPS='1', FORCE_CUDA='1' if ops == 'cuda' else '0',
               MAX_JOBS=os.environ.get('MAX_JOBS', str(os.cpu_count() or 2)))
    if ops == 'cpu':
        env['CUDA_VISIBLE_DEVICES'] = ''  # keep setup.py from picking CUDA extensions
    else:
        env['TORCH_CUDA_ARCH_LIST'] = arch_list
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


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--venv', default=os.environ.get('MMPOLA_VENV', osp.join(REPO, '.venv')),
                        help='virtual environment to create/update (default: .venv in the repo)')
    parser.add_argument('--python', default=None,
                        help='install into this existing interpreter instead of a venv; its torch/torchvision '
                        f'build (e.g. your CUDA build, torch >= {".".join(map(str, MIN_TORCH))}) is kept as it is')
    parser.add_argument('--torch-index-url', default=os.environ.get('MMPOLA_TORCH_INDEX_URL'),
                        help='index for torch/torchvision (e.g. a specific CUDA build; default: the registry\'s '
                        'build, or the newest CUDA build the NVIDIA driver runs)')
    parser.add_argument('--wheelhouse', default=os.environ.get('MMPOLA_WHEELHOUSE', DEFAULT_WHEELHOUSE),
                        help='where built mmcv wheels are kept (outside the clone)')
    parser.add_argument('--yes', action='store_true',
                        help='accept what the set-up lists before doing it: changed package versions in the '
                        '--python environment, a --torch-index-url build the driver is too old for')
    parser.add_argument('--force', action='store_true', help='reinstall even if up to date')
    return parser.parse_args(argv)


def main(argv=None):
    try:
        setup(parse_args(argv))
    except SetupError as e:
        fail(str(e))


def setup(args):
    start = time.time()
    pins = read_pins()
    ops_override = os.environ.get('MMPOLA_MMCV_OPS') or None
    gpus, smi_error = probe_gpus()
    arch_env = os.environ.get('TORCH_CUDA_ARCH_LIST')
    gpu_machine = nvidia_smi() is not None or bool(arch_env and arch_env.strip())
    if smi_error:
        log(f'nvidia-smi failed ({smi_error}): set up as for a machine without a GPU')
    elif gpus:
        log(f'GPU(s): {describe_gpus(gpus)}, NVIDIA driver {gpus[0]["driver"]}')

    if args.python:
        python = args.python
        prefix_code, prefix, _ = py_info(python, 'import sys; print(sys.prefix)')
        if prefix_code != 0:
            raise SetupError(f'--python {python!r} is not a working Python interpreter')
    else:
        if sys.version_info < (3, 10):
            raise SetupError(f'Python >= 3.10 is needed (torch {pins["torch"]} supports no older one); this is '
                             f'{sys.version.split()[0]}: run the set-up with a newer python3')
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
                problem = env_fit_problem(json.loads(out), gpus, ops_override)
                if problem is None:
                    log(f'environment is up to date ({prefix}); checked in {time.time() - start:.1f} s')
                    return
                log(f'the environment imports but does not suit this machine: {problem}; repairing')
            else:
                log('environment stamp is current but the import check failed; repairing:\n' + err[-800:])

    driver = gpus[0]['driver'] if gpus else None
    constraints = osp.join(prefix, 'mmpola-torch-constraints.txt')
    build_reqs = [spec(pins, n) for n in ('setuptools', 'wheel', 'ninja', 'numpy', 'opencv-python')]
    stack = [spec(pins, n) for n in (
        'mmengine', 'mmdet', 'mmsegmentation', 'ftfy', 'regex', 'timm', 'pycocotools',
        'numpy', 'opencv-python', 'setuptools', 'pytest', 'pytest-xdist', 'execnet', 'ruff')]

    # 1. torch + torchvision: a matching pair from one source
    if args.python:
        info, err = torch_pair(python)
        if info is None:
            raise SetupError(f'--python mode keeps your torch build, but torch/torchvision do not import '
                             f'together in {python}: {err}. Install a matching pair first (see docs/install.md).')
        check_user_torch(info[0], python)
        problem = torch_fit_problem(info[0], info[2], info[3], gpus)
        if problem:
            raise SetupError(f'{problem}. --python keeps the torch of {python}: change it there (torch and '
                             'torchvision together)')
        log(f'keeping torch {info[0]} / torchvision {info[1]} (CUDA {info[2]})')
        write_constraints(constraints, info)
        review_changes(python, build_reqs + stack + [spec(pins, 'uv')], constraints, args.yes)
        uv = ensure_uv(python, pins)
    else:
        uv = ensure_uv(python, pins)
        index_url, note = choose_torch_index(driver, args.torch_index_url, pins['torch'], args.yes)
        if note:
            log(note)
        torch_args = [spec(pins, 'torch'), spec(pins, 'torchvision')]
        if index_url:
            torch_args += ['--index-url', index_url]
        current, _ = torch_pair(python)
        if current is not None and current[2] != wanted_torch_cuda(index_url):
            log(f'replacing torch {current[0]} (CUDA {current[2]}) with the build from {index_url or "the registry"}')
            torch_args += ['--reinstall-package', 'torch', '--reinstall-package', 'torchvision']
        uv_install(uv, python, torch_args)
        info, err = torch_pair(python)
        if info is None:
            raise SetupError(f'torch and torchvision do not import together: {err}. They must be from the same '
                             'release train and build (see DEVELOPERS.md, "torch / torchvision").')
        write_constraints(constraints, info)
        problem = torch_fit_problem(info[0], info[2], info[3], gpus)
        if problem:  # before the mmcv build, which would be for nothing
            raise SetupError(problem)

    # 2. which mmcv ops (decided before anything is built), its build requirements, the wheel (cached)
    torch_version, cuda = info[0], info[2]
    nvcc_path, nvcc_version = probe_nvcc()
    ops = decide_mmcv_ops(ops_override, cuda, nvcc_version, gpus, gpu_machine)
    arch_list = None
    if ops == 'cuda':
        check_nvcc_matches_torch(nvcc_path, nvcc_version, torch_version, cuda)
        arch_list, source = decide_arch_list(arch_env, gpus, nvcc_version)
        log(f'mmcv: CUDA ops, nvcc {nvcc_path} (CUDA {nvcc_version}), GPU architectures {arch_list} (from {source})')
    elif cuda and nvcc_version and not ops_override:
        log(f'mmcv: CPU ops: nvcc {nvcc_path} is here but no GPU, nvidia-smi or TORCH_CUDA_ARCH_LIST; to build CUDA '
            'ops for GPU jobs from this machine, set TORCH_CUDA_ARCH_LIST (e.g. "8.0;9.0") or MMPOLA_MMCV_OPS=cuda')
    others = other_opencv(installed_distributions(python))
    if others and args.python and not args.yes:
        raise SetupError(f'{python} has {", ".join(others)} besides opencv-python: they write the same cv2 files, '
                         'so the one installed last wins. Re-run with --yes to remove them (opencv-python, which '
                         'mmengine requires, is then reinstalled), or use a separate environment')
    if others:
        log(f'removing {", ".join(others)}: opencv-python (mmengine\'s requirement) provides cv2')
        run([uv, 'pip', 'uninstall', '--python', python] + others)
    uv_install(uv, python, build_reqs + ['-c', constraints]
               + (['--reinstall-package', 'opencv-python'] if others else []))
    wheel = mmcv_wheel(python, pins, torch_version, cuda, ops, arch_list, args.wheelhouse)

    # 3. the rest of the stack and mmpola itself (editable)
    uv_install(uv, python, [wheel] + stack + ['-c', constraints, '--reinstall-package', 'mmcv'])
    uv_install(uv, python, ['--no-deps', '-e', REPO])

    code, out, err = py_info(python, CHECK_CODE)
    if code != 0:
        raise SetupError('the environment does not import cleanly:\n' + err[-3000:])
    versions = json.loads(out)
    problem = env_fit_problem(versions, gpus, ops_override)
    if problem:
        raise SetupError(f'{problem} (docs/install.md, "Set-up on GPU machines")')
    with open(stamp_path, 'w') as f:
        json.dump(dict(fingerprint=want, repo=REPO, versions=versions, mmcv_wheel=wheel, mmcv_ops=ops,
                       arch_list=arch_list), f, indent=1)
    log('ready in %.0f s: %s' % (time.time() - start, ', '.join(f'{k} {v}' for k, v in versions.items())))


def write_constraints(path, info):
    """Pin what is installed (distribution versions, which may lack the '+cu130' label that
    torch.__version__ shows) so later installs never swap torch underneath the mmcv build."""
    with open(path, 'w') as f:
        f.write(f'torch=={info[4]}\ntorchvision=={info[5]}\n')


if __name__ == '__main__':
    main()
