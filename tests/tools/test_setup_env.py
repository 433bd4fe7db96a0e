"""tools/setup_env.py's decisions on GPU machines, with the machine made up.

The set-up's decisions are functions of probed facts (nvcc's and nvidia-smi's output, torch's
CUDA version, the environment's import report); here they get the facts of machines this one is
not: login nodes with nvcc and no GPU, GPU nodes with old drivers, mismatched toolkits, user
environments with old torch or newer numpy. The flow tests run ``setup()`` with every tool that
would install or build replaced by a recorder, and check where it stops.
"""
import json
import os
import os.path as osp
import stat
import types

import pytest

from tests.fixtures.tools import load_tool


@pytest.fixture(scope='module')
def se():
    module = load_tool('setup_env')
    return module


A100 = dict(name='NVIDIA A100-SXM4-80GB', compute_cap='8.0', driver='580.82.07')
H100 = dict(name='NVIDIA H100 80GB HBM3', compute_cap='9.0', driver='580.82.07')


# ----------------------------------------------------------------------------------------------
# mmcv: ops kind, architectures, nvcc vs torch, wheel cache key

def test_cuda_ops_whenever_nvcc_and_a_cuda_torch_exist_on_a_gpu_machine(se):
    assert se.decide_mmcv_ops(None, '13.0', '13.0', [], gpu_machine=True) == 'cuda'  # login node: no GPU visible
    assert se.decide_mmcv_ops(None, '13.0', '13.0', [A100]) == 'cuda'
    assert se.decide_mmcv_ops(None, '13.0', '13.0', []) == 'cpu'  # this project's CPU machines (CI): as before
    assert se.decide_mmcv_ops(None, '13.0', None, []) == 'cpu'
    assert se.decide_mmcv_ops(None, None, '12.8', [], gpu_machine=True) == 'cpu'  # CPU build of torch
    assert se.decide_mmcv_ops('cuda', '13.0', '13.0', []) == 'cuda'
    assert se.decide_mmcv_ops('cpu', '13.0', '13.0', [A100]) == 'cpu'
    with pytest.raises(se.SetupError, match='nvcc was not found') as exc:  # a GPU, no toolkit
        se.decide_mmcv_ops(None, '13.0', None, [A100])
    assert 'MMPOLA_MMCV_OPS=cpu' in str(exc.value) and 'CUDA 13.x toolkit' in str(exc.value)
    with pytest.raises(se.SetupError, match='nvcc was not found'):
        se.decide_mmcv_ops('cuda', '13.0', None, [])
    with pytest.raises(se.SetupError, match='CPU build'):
        se.decide_mmcv_ops('cuda', None, '13.0', [])
    with pytest.raises(se.SetupError, match="must be 'cpu' or 'cuda'"):
        se.decide_mmcv_ops('gpu', '13.0', '13.0', [])


def test_arch_list_from_variable_then_gpus_then_default(se):
    assert se.decide_arch_list('8.0 8.6+PTX', [A100], '13.0')[0] == '8.0;8.6+PTX'
    assert se.decide_arch_list(None, [H100, A100, A100], '13.0') == ('8.0;9.0', 'the visible GPU(s)')
    arch, source = se.decide_arch_list('', [], '13.0')
    assert 'default' in source and arch == '7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX'  # CUDA 13: no Volta
    assert se.decide_arch_list(None, [], '12.8')[0] == '7.0;7.5;8.0;8.6;8.9;9.0;10.0;12.0+PTX'
    assert se.decide_arch_list(None, [], '12.4')[0] == '7.0;7.5;8.0;8.6;8.9;9.0+PTX'  # before Blackwell
    # an old driver's nvidia-smi has no compute_cap: the default list
    assert 'default' in se.decide_arch_list(None, [dict(A100, compute_cap=None)], '12.4')[1]


def test_wheel_key_has_ops_kind_and_arch_list(se):
    # the CPU key is the one earlier set-ups wrote: their cached wheels are still found
    assert (se.wheel_key('2.1.0', '2.13.0+cu130', '13.0', 'cpu', '311')
            == 'mmcv-2.1.0_torch-2.13.0-cu130_cuda-13.0_ops-cpu_py311')
    a100 = se.wheel_key('2.1.0', '2.13.0+cu130', '13.0', 'cuda', '311', '8.0')
    assert a100 == 'mmcv-2.1.0_torch-2.13.0-cu130_cuda-13.0_ops-cuda_arch-8.0_py311'
    assert se.wheel_key('2.1.0', '2.13.0+cu130', '13.0', 'cuda', '311', '8.0;9.0') != a100


def test_nvcc_major_must_match_torch(se):
    se.check_nvcc_matches_torch('/usr/local/cuda/bin/nvcc', '13.0', '2.13.0+cu130', '13.0')
    se.check_nvcc_matches_torch('/usr/local/cuda/bin/nvcc', '12.4', '2.13.0+cu128', '12.8')  # same major
    with pytest.raises(se.SetupError) as exc:
        se.check_nvcc_matches_torch('/usr/local/cuda/bin/nvcc', '12.8', '2.13.0+cu130', '13.0')
    msg = str(exc.value)
    assert 'CUDA 12.8' in msg and 'torch 2.13.0+cu130' in msg and 'CUDA 13.0' in msg
    assert 'CUDA_HOME=/usr/local/cuda-13.x' in msg and '--torch-index-url https://download.pytorch.org/whl/cu128' in msg
    assert 'MMPOLA_MMCV_OPS=cpu' in msg


# ----------------------------------------------------------------------------------------------
# torch: the build the driver runs, the user's torch

def test_torch_build_for_the_driver(se):
    assert se.choose_torch_index(None, None, '2.13.0') == (None, None)  # no GPU: the default, unchecked
    assert se.choose_torch_index('580.82.07', None, '2.13.0') == (None, None)
    url, note = se.choose_torch_index('550.54.14', None, '2.13.0')
    assert url == 'https://download.pytorch.org/whl/cu128'
    assert 'driver 550.54.14 is too old' in note and '580.65.06' in note and 'CUDA 12.8' in note
    with pytest.raises(se.SetupError, match='too old for every CUDA build') as exc:
        se.choose_torch_index('470.199.02', None, '2.13.0')
    assert 'https://download.pytorch.org/whl/cpu' in str(exc.value)
    with pytest.raises(se.SetupError) as exc:  # asked for a build the driver cannot run
        se.choose_torch_index('550.54.14', 'https://download.pytorch.org/whl/cu130', '2.13.0')
    assert 'needs NVIDIA driver >= 580.65.06' in str(exc.value) and '/whl/cu128' in str(exc.value)
    url, note = se.choose_torch_index('550.54.14', 'https://download.pytorch.org/whl/cu130', '2.13.0', accept=True)
    assert url.endswith('/cu130') and note.startswith('WARNING')
    assert se.choose_torch_index('550.54.14', 'https://download.pytorch.org/whl/cpu', '2.13.0')[1] is None
    assert se.wanted_torch_cuda(None) == se.DEFAULT_TORCH_CUDA
    assert se.wanted_torch_cuda('https://download.pytorch.org/whl/cu126') == '12.6'
    assert se.wanted_torch_cuda('https://download.pytorch.org/whl/cpu') is None


def test_user_torch_older_than_mmpolas_minimum_is_refused(se):
    major, minor = se.MIN_TORCH
    se.check_user_torch(f'{major}.{minor}.0+cu128', '/envs/a/bin/python')
    with pytest.raises(se.SetupError) as exc:
        se.check_user_torch(f'{major}.{minor - 1}.1+cu128', '/envs/a/bin/python')
    assert str(exc.value) == (
        f'in /envs/a/bin/python: torch {major}.{minor - 1}.1+cu128 is older than {major}.{minor}, the oldest torch '
        f'mmpola is tested with; upgrade torch and torchvision together (torch >= {major}.{minor}, docs/install.md); '
        'or leave out --python to let the set-up create .venv with the pinned torch')


# ----------------------------------------------------------------------------------------------
# "up to date" means: suits this machine

def _report(**kwargs):
    report = dict(torch='2.13.0+cu130', cuda='13.0', gpu=True, mmcv='2.1.0', mmcv_ops='cuda', mmcv_cuda='13.0',
                  cuda_ops_error=None)
    report.update(kwargs)
    return report


def test_env_fit_on_gpu_machines(se):
    cpu_ops = _report(gpu=False, mmcv_ops='cpu', mmcv_cuda='not available')
    assert se.env_fit_problem(cpu_ops, []) is None  # a CPU machine takes CPU ops
    assert 'built with CPU ops only' in se.env_fit_problem(_report(mmcv_ops='cpu'), [A100])
    assert se.env_fit_problem(_report(mmcv_ops='cpu'), [A100], ops_override='cpu') is None
    problem = se.env_fit_problem(_report(cuda_ops_error='RuntimeError: CUDA error: no kernel image is available '
                                         'for execution on the device'), [H100])
    assert 'no kernel image' in problem and 'compute capability 9.0' in problem and 'TORCH_CUDA_ARCH_LIST' in problem
    problem = se.env_fit_problem(_report(gpu=False), [dict(A100, driver='535.104.05')])
    assert 'cannot use' in problem and 'driver 535.104.05 is older than a CUDA 13.0 build needs' in problem
    assert '(>= 580.65.06)' in problem
    problem = se.env_fit_problem(_report(gpu=False), [A100])  # the driver would do: something hides the GPU
    assert 'CUDA_VISIBLE_DEVICES' in problem
    assert se.env_fit_problem(_report(), [A100]) is None
    assert se.env_fit_problem(_report(cuda=None, gpu=False, mmcv_ops='cpu'), [A100]) is None  # CPU torch on purpose


# ----------------------------------------------------------------------------------------------
# --python: list what would change, require --yes

PIP_REPORT = {'install': [{'metadata': {'name': 'numpy', 'version': '1.26.4'}},
                          {'metadata': {'name': 'setuptools', 'version': '80.8.0'}},
                          {'metadata': {'name': 'mmengine', 'version': '0.10.7'}},
                          {'metadata': {'name': 'opencv_python', 'version': '4.11.0.86'}}]}
INSTALLED = {'numpy': '2.1.3', 'setuptools': '75.1.0', 'opencv-python': '4.11.0.86', 'torch': '2.5.1'}


def test_planned_changes_name_up_and_downgrades(se):
    changed, added = se.planned_changes(PIP_REPORT, INSTALLED)
    assert changed == [('numpy', '2.1.3', '1.26.4'), ('setuptools', '75.1.0', '80.8.0')]
    assert added == ['mmengine 0.10.7']
    assert se.format_changes(changed) == 'numpy 2.1.3 -> 1.26.4 (downgrade), setuptools 75.1.0 -> 80.8.0 (upgrade)'


def test_review_changes_stops_without_yes(se, monkeypatch, capsys):
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        with open(cmd[cmd.index('--report') + 1], 'w') as f:
            json.dump(PIP_REPORT, f)
        return types.SimpleNamespace(returncode=0, stdout='')

    monkeypatch.setattr(se, 'py_info', lambda python, code: (0, json.dumps(INSTALLED), ''))
    monkeypatch.setattr(se.subprocess, 'run', fake_run)
    with pytest.raises(se.SetupError) as exc:
        se.review_changes('/envs/a/bin/python', ['numpy==1.26.4'], '/envs/a/c.txt', accept=False)
    assert 'numpy 2.1.3 -> 1.26.4 (downgrade)' in str(exc.value) and '--yes' in str(exc.value)
    assert calls[0][1:5] == ['-m', 'pip', 'install', '--dry-run']  # nothing installed
    se.review_changes('/envs/a/bin/python', ['numpy==1.26.4'], '/envs/a/c.txt', accept=True)
    assert 'changing (--yes): numpy 2.1.3 -> 1.26.4 (downgrade)' in capsys.readouterr().out


# ----------------------------------------------------------------------------------------------
# the probes, with fake nvcc / nvidia-smi

def _fake_tool(path, script):
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write('#!/bin/sh\n' + script)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)


def test_probes_read_nvcc_and_nvidia_smi(se, tmp_path, monkeypatch):
    monkeypatch.setenv('CUDA_HOME', str(tmp_path / 'cuda'))
    monkeypatch.setenv('PATH', str(tmp_path / 'bin'))
    assert se.probe_nvcc() == (None, None)
    assert se.probe_gpus() == ([], None)
    nvcc = str(tmp_path / 'cuda' / 'bin' / 'nvcc')
    _fake_tool(nvcc, 'echo "nvcc: NVIDIA (R) Cuda compiler driver"; echo "Cuda compilation tools, release 12.8, '
               'V12.8.93"\n')
    assert se.probe_nvcc() == (nvcc, '12.8')
    smi = str(tmp_path / 'bin' / 'nvidia-smi')
    _fake_tool(smi, 'echo "NVIDIA H100 80GB HBM3, 9.0, 580.82.07"\necho "NVIDIA H100 80GB HBM3, 9.0, 580.82.07"\n')
    assert se.probe_gpus() == ([H100, H100], None)
    # an old driver does not know compute_cap: asked again without it
    _fake_tool(smi, 'case "$1" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\'; '
               'exit 2;; esac\necho "Tesla V100-SXM2-32GB, 470.199.02"\n')
    assert se.probe_gpus() == ([dict(name='Tesla V100-SXM2-32GB', compute_cap=None, driver='470.199.02')], None)
    _fake_tool(smi, "echo \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"; exit 9\n")
    gpus, error = se.probe_gpus()
    assert gpus == [] and error.startswith('NVIDIA-SMI has failed')


# ----------------------------------------------------------------------------------------------
# the flow: where setup() stops, with installs and builds replaced by recorders

class Stop(Exception):
    pass


@pytest.fixture
def machine(se, monkeypatch, tmp_path):
    """A venv-mode set-up on a made-up machine; ``machine.installs`` records the uv installs."""
    venv = tmp_path / 'venv'
    (venv / 'bin').mkdir(parents=True)
    (venv / 'bin' / 'python').write_text('')
    state = types.SimpleNamespace(installs=[], gpus=[], nvcc=(None, None), torch=None, venv=str(venv),
                                  report=None, built=[])
    torch_info = ['2.13.0+cu130', '0.28.0+cu130', '13.0', False, '2.13.0', '0.28.0']

    def py_info(python, code):
        if code == se.CHECK_CODE:
            return 0, json.dumps(state.report), ''
        return 0, '311', ''

    monkeypatch.setattr(se, 'probe_gpus', lambda: (state.gpus, None))
    monkeypatch.setattr(se, 'nvidia_smi', lambda: '/usr/bin/nvidia-smi' if state.gpus else None)
    monkeypatch.setattr(se, 'probe_nvcc', lambda: state.nvcc)
    monkeypatch.setattr(se, 'py_info', py_info)
    monkeypatch.setattr(se, 'ensure_uv', lambda python, pins: 'uv')
    monkeypatch.setattr(se, 'uv_install', lambda uv, python, args, extra_env=None: state.installs.append(args))
    # a CUDA torch sees the GPUs the machine has, unless a test says otherwise
    monkeypatch.setattr(se, 'torch_pair', lambda python: (state.torch or torch_info[:3] + [bool(state.gpus)]
                                                           + torch_info[4:], None))
    monkeypatch.setattr(se, 'mmcv_wheel', lambda *a: state.built.append(a) or (_ for _ in ()).throw(Stop()))
    monkeypatch.delenv('MMPOLA_MMCV_OPS', raising=False)
    monkeypatch.delenv('TORCH_CUDA_ARCH_LIST', raising=False)
    state.args = lambda *argv: se.parse_args(['--venv', str(venv), '--wheelhouse', str(tmp_path / 'wh'), *argv])
    return state


def test_up_to_date_env_with_cpu_ops_is_rebuilt_on_a_gpu_machine(se, machine, capsys):
    with open(osp.join(machine.venv, se.STAMP_NAME), 'w') as f:
        json.dump(dict(fingerprint=se.fingerprint(), repo=se.REPO), f)
    machine.report = _report(gpu=False, mmcv_ops='cpu', mmcv_cuda='not available')
    se.setup(machine.args())  # a CPU machine: accepted as it is
    assert 'environment is up to date' in capsys.readouterr().out and machine.installs == []

    machine.gpus, machine.nvcc = [A100], ('/usr/local/cuda/bin/nvcc', '13.0')
    machine.report = _report(mmcv_ops='cpu', mmcv_cuda='not available')
    with pytest.raises(Stop):
        se.setup(machine.args())
    out = capsys.readouterr().out
    assert 'does not suit this machine: mmcv 2.1.0 was built with CPU ops only' in out
    torch_version, cuda, ops, arch_list = machine.built[0][2:6]
    assert (ops, arch_list) == ('cuda', '8.0')  # a CUDA build for the visible GPU


def test_cpu_machine_with_a_cuda_toolkit_keeps_cpu_ops_unless_told(se, machine, monkeypatch, capsys):
    """This project's machines (CI's too) have a CUDA torch and nvcc but no GPU: CPU ops, the same
    wheel as before; TORCH_CUDA_ARCH_LIST (a login node building for GPU jobs) asks for CUDA ops."""
    machine.nvcc = ('/usr/local/cuda/bin/nvcc', '13.0')
    with pytest.raises(Stop):
        se.setup(machine.args())
    assert machine.built[-1][2:6] == ('2.13.0+cu130', '13.0', 'cpu', None)
    assert 'set TORCH_CUDA_ARCH_LIST' in capsys.readouterr().out
    monkeypatch.setenv('TORCH_CUDA_ARCH_LIST', '8.0;9.0')
    with pytest.raises(Stop):
        se.setup(machine.args())
    assert machine.built[-1][2:6] == ('2.13.0+cu130', '13.0', 'cuda', '8.0;9.0')


def test_nvcc_mismatch_stops_before_the_build(se, machine):
    machine.gpus, machine.nvcc = [H100], ('/usr/local/cuda-12.8/bin/nvcc', '12.8')
    with pytest.raises(se.SetupError, match='nvcc /usr/local/cuda-12.8/bin/nvcc is CUDA 12.8'):
        se.setup(machine.args())
    assert len(machine.installs) == 1 and machine.installs[0][:2] == ['torch==2.13.0', 'torchvision==0.28.0']
    assert machine.built == []  # no build requirements, no build


def test_old_driver_gets_the_matching_torch_build(se, machine, capsys, monkeypatch):
    machine.gpus = [dict(A100, driver='550.54.14')]
    machine.nvcc = ('/usr/local/cuda/bin/nvcc', '12.8')
    machine.torch = ['2.13.0+cu130', '0.28.0+cu130', '13.0', False, '2.13.0', '0.28.0']  # what is there now
    cu128 = ['2.13.0+cu128', '0.28.0+cu128', '12.8', True, '2.13.0+cu128', '0.28.0+cu128']
    monkeypatch.setattr(se, 'uv_install', lambda uv, python, args, extra_env=None: (
        machine.installs.append(args), '--index-url' in args and setattr(machine, 'torch', cu128)))
    with pytest.raises(Stop):
        se.setup(machine.args())
    out = capsys.readouterr().out
    assert 'NVIDIA driver 550.54.14 is too old for the default torch 2.13.0 build' in out
    torch_args = machine.installs[0]
    assert torch_args[torch_args.index('--index-url') + 1] == 'https://download.pytorch.org/whl/cu128'
    assert '--reinstall-package' in torch_args  # the installed cu130 build is replaced
    assert machine.built[0][2:6] == ('2.13.0+cu128', '12.8', 'cuda', '8.0')  # mmcv for that torch


def test_torch_that_does_not_see_the_gpu_stops_before_the_build(se, machine):
    machine.gpus, machine.nvcc = [A100], ('/usr/local/cuda/bin/nvcc', '13.0')
    machine.torch = ['2.13.0+cu130', '0.28.0+cu130', '13.0', False, '2.13.0', '0.28.0']
    with pytest.raises(se.SetupError, match='CUDA_VISIBLE_DEVICES does not hide the GPUs'):
        se.setup(machine.args())
    assert machine.built == [] and len(machine.installs) == 1  # torch only


def test_python_mode_with_a_torch_the_driver_cannot_run_stops_first(se, machine, monkeypatch):
    machine.gpus = [dict(A100, driver='550.54.14')]
    machine.torch = ['2.13.0+cu130', '0.28.0+cu130', '13.0', False, '2.13.0', '0.28.0']
    monkeypatch.setattr(se, 'ensure_uv', lambda python, pins: pytest.fail('nothing may be installed'))
    with pytest.raises(se.SetupError, match='driver 550.54.14 is older than a CUDA 13.0 build needs'):
        se.setup(se.parse_args(['--python', osp.join(machine.venv, 'bin', 'python')]))


def test_python_mode_refuses_old_torch_before_installing_anything(se, machine, monkeypatch):
    machine.torch = ['2.3.1+cu121', '0.18.1+cu121', '12.1', True, '2.3.1', '0.18.1']
    monkeypatch.setattr(se, 'ensure_uv', lambda python, pins: pytest.fail('nothing may be installed'))
    with pytest.raises(se.SetupError, match=r'older than \d+\.\d+, the oldest torch mmpola is tested with'):
        se.setup(se.parse_args(['--python', osp.join(machine.venv, 'bin', 'python')]))
    assert machine.installs == []


# ----------------------------------------------------------------------------------------------
# requirements: one file of tested versions, one of development tools, one OpenCV

def test_pins_hold_one_opencv_and_no_dev_tools(se):
    runtime = se.read_pins([se.PINS_FILE])
    dev = se.read_pins([se.DEV_FILE])
    assert 'opencv-python' in runtime and not set(se.OTHER_OPENCV) & set(runtime)
    assert {'pytest', 'ruff', 'uv'} <= set(dev) and not {'pytest', 'ruff', 'uv'} & set(runtime)
    assert 'einops' not in se.read_pins()  # imported nowhere
    assert se.read_pins()['uv'] == dev['uv']  # both files are read by the set-up


def test_other_opencv_distributions_are_removed_from_the_venv(se, machine, monkeypatch, capsys):
    installed = {'opencv-python': '4.11.0.86', 'opencv-python-headless': '4.11.0.86', 'numpy': '1.26.4'}
    commands = []
    monkeypatch.setattr(se, 'installed_distributions', lambda python: installed)
    monkeypatch.setattr(se, 'run', lambda cmd, **kwargs: commands.append(cmd))
    with pytest.raises(Stop):
        se.setup(machine.args())
    assert commands == [['uv', 'pip', 'uninstall', '--python', osp.join(machine.venv, 'bin', 'python'),
                         'opencv-python-headless']]
    build_reqs = machine.installs[1]
    assert 'opencv-python==4.11.0.86' in build_reqs and build_reqs[-2:] == ['--reinstall-package', 'opencv-python']
    assert not any('headless' in arg for arg in build_reqs)
    assert 'removing opencv-python-headless' in capsys.readouterr().out


def test_python_mode_asks_before_removing_another_opencv(se, machine, monkeypatch):
    monkeypatch.setattr(se, 'installed_distributions', lambda python: {'opencv-python-headless': '4.10.0.84'})
    monkeypatch.setattr(se, 'review_changes', lambda *a: None)
    monkeypatch.setattr(se, 'write_constraints', lambda *a: None)
    with pytest.raises(se.SetupError, match='opencv-python-headless besides opencv-python.*--yes'):
        se.setup(se.parse_args(['--python', osp.join(machine.venv, 'bin', 'python')]))
    assert machine.installs == []
