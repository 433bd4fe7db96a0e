"""The device check (never a silent CPU run), the rank-0 check shared with every rank, and the
machine's fallbacks (SyncBN -> BN, gloo, bf16 AMP on the CPU).

CUDA is reported unusable by monkeypatching torch and nvidia-smi, so these tests say the same on
machines with and without a GPU.
"""
import multiprocessing
import os
import os.path as osp
import socket
import stat
import subprocess
import sys
from datetime import timedelta

import pytest
import torch
from mmengine.config import Config

from mmpola.errors import MMPolaUserError, UserError
from mmpola.runtime import launch
from tests.fixtures.paths import REPO
from tests.fixtures.runs import free_port

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason='checks the CPU-only fallbacks')

DEMO_CONFIG = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')


def _facts(**kwargs):
    facts = dict(available=False, torch='2.13.0+cu130', torch_cuda='13.0', visible_devices=None, gpus=None,
                 driver=None, smi_error=None, device_count=0)
    facts.update(kwargs)
    return facts


@pytest.fixture
def no_cuda(monkeypatch):
    """torch reports CUDA unusable; ``no_cuda(gpus, driver)`` sets what nvidia-smi would list."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(torch.version, 'cuda', '13.0')
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    monkeypatch.delenv(launch.DEVICE_ENV, raising=False)

    def set_smi(gpus=None, driver=None, error=None):
        monkeypatch.setattr(launch, 'nvidia_smi_gpus', lambda: (gpus, driver, error))
    set_smi()
    return set_smi


def test_cuda_problem_names_each_cause():
    assert launch.cuda_problem(_facts(available=True)) is None
    cause, fix = launch.cuda_problem(_facts(torch='2.13.0+cpu', torch_cuda=None))
    assert '2.13.0+cpu' in cause and 'no CUDA support' in cause and 'setup_env.py' in fix
    cause, fix = launch.cuda_problem(_facts(visible_devices='', gpus=['NVIDIA A100'] * 8))
    assert 'CUDA_VISIBLE_DEVICES' in cause and 'hides every GPU' in cause and 'unset' in fix
    cause, fix = launch.cuda_problem(_facts(gpus=['NVIDIA A100-SXM4-80GB'] * 8, driver='525.60.13'))
    assert '8 GPU(s)' in cause and 'driver 525.60.13' in cause and 'CUDA 13.0' in cause
    assert 'torch.cuda.is_available() is False' in cause and 'setup_env.py' in fix and 'driver' in fix
    cause, _ = launch.cuda_problem(_facts(gpus=['NVIDIA A100-SXM4-80GB'] * 4, visible_devices='4,5'))
    assert "CUDA_VISIBLE_DEVICES='4,5' names no existing GPU (nvidia-smi numbers them 0..3)" in cause
    cause, fix = launch.cuda_problem(_facts(gpus=[], smi_error="NVIDIA-SMI has failed because it couldn't "
                                            'communicate with the NVIDIA driver'))
    assert 'NVIDIA-SMI has failed' in cause and 'driver' in fix
    assert 'nvidia-smi is not installed' in launch.cuda_problem(_facts())[0]
    assert 'nvidia-smi lists no GPU' in launch.cuda_problem(_facts(gpus=[]))[0]


@pytest.mark.parametrize('launcher', ['pytorch', 'slurm'])
def test_multi_process_launch_without_cuda_stops_with_the_cause(no_cuda, launcher):
    no_cuda(['NVIDIA H100 80GB HBM3'] * 4, '535.104.05')
    with pytest.raises(UserError) as exc:
        launch.check_device(launcher)
    msg = str(exc.value)
    assert f'--launcher {launcher} starts one process per GPU' in msg and 'CUDA is not usable' in msg
    assert 'driver 535.104.05' in msg and 'CUDA 13.0' in msg  # driver / torch mismatch
    assert '--device cpu' in msg and 'MMPOLA_DEVICE=cpu' in msg


def test_empty_cuda_visible_devices_is_named(no_cuda, monkeypatch):
    no_cuda(['NVIDIA H100 80GB HBM3'], '580.65.06')
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')
    with pytest.raises(UserError, match="CUDA_VISIBLE_DEVICES is set to ''"):
        launch.check_device('pytorch')


def test_single_process_on_cpu_warns_once_and_runs(no_cuda, capsys):
    assert launch.check_device('none') == 'cpu'
    out, err = capsys.readouterr()
    assert out.count('\n') == 1 and out.startswith('WARNING: running on the CPU: CUDA is not usable')
    assert 'nvidia-smi is not installed' in out and '--device cpu' in out
    assert err == ''  # stderr is the tools' error line's


def test_cpu_asked_for_is_silent_and_hides_the_gpus(no_cuda, monkeypatch, capsys):
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '0,1')
    assert launch.check_device('pytorch', 'cpu') == 'cpu'
    assert os.environ['CUDA_VISIBLE_DEVICES'] == ''
    monkeypatch.setenv(launch.DEVICE_ENV, 'cpu')
    assert launch.check_device('slurm') == 'cpu'
    assert capsys.readouterr() == ('', '')


@pytest.mark.parametrize('argv, env, hidden', [(['--device', 'cpu'], {}, True), (['--device=cpu'], {}, True),
                                               ([], {'MMPOLA_DEVICE': 'cpu'}, True), (['--device', 'cuda'], {}, False),
                                               ([], {}, False)])
def test_tools_hide_the_gpus_before_torch_loads(argv, env, hidden):
    """mmengine asks CUDA for its devices when imported: the tools' bootstrap hides them first."""
    code = ('import sys, os; sys.path.insert(0, "tools"); import _mmpola_tools; '
            'print(repr(os.environ.get("CUDA_VISIBLE_DEVICES")), "torch" in sys.modules)')
    full_env = {k: v for k, v in os.environ.items() if k not in ('CUDA_VISIBLE_DEVICES', launch.DEVICE_ENV)}
    out = subprocess.run([sys.executable, '-c', code, *argv], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env=dict(full_env, **env), check=True).stdout.split()
    assert out == (["''", 'False'] if hidden else ['None', 'False'])


def test_cuda_asked_for_stops_a_single_process_too(no_cuda, monkeypatch):
    with pytest.raises(UserError, match=r'--device cuda \(MMPOLA_DEVICE=cuda\) asks for a GPU'):
        launch.check_device('none', 'cuda')
    monkeypatch.setenv(launch.DEVICE_ENV, 'gpu')
    with pytest.raises(UserError, match="MMPOLA_DEVICE='gpu' is not a device choice"):
        launch.check_device('none')


def test_usable_cuda_passes_with_a_gpu_per_local_rank(monkeypatch):
    monkeypatch.delenv(launch.DEVICE_ENV, raising=False)
    four = _facts(available=True, device_count=4, visible_devices='0,1,2,3')
    assert launch.check_device('pytorch', environ={'LOCAL_RANK': '3'}, facts=four) == 'cuda'
    assert launch.check_device('none', environ={}, facts=four) == 'cuda'
    with pytest.raises(UserError) as exc:  # tools/dist_train.sh CONFIG 8 on a 4-GPU machine
        launch.check_device('pytorch', environ={'LOCAL_RANK': '5'}, facts=four)
    assert 'local rank 5, but only 4 GPU(s) are visible' in str(exc.value)
    assert 'dist_train.sh CONFIG 4' in str(exc.value)
    with pytest.raises(UserError, match='local rank 4'):
        launch.check_device('slurm', environ={'SLURM_LOCALID': '4'}, facts=four)


def test_launch_check_needs_cuda_and_a_gpu_per_process(no_cuda, monkeypatch):
    """tools/dist_*.sh check once before torchrun: usable CUDA with a GPU for each process, unless the
    CPU is asked for."""
    with pytest.raises(UserError, match='--launcher pytorch starts one process per GPU, but CUDA is not usable here: '
                                        'no GPU is visible'):
        launch.check_launch(2, ['--cfg-options', 'a=1'])
    launch.check_launch(2, ['--device', 'cpu'], environ={}, facts=_facts())  # asked for: nothing to check
    launch.check_launch(2, ['--device=cpu'], environ={}, facts=_facts())
    launch.check_launch(2, [], environ={launch.DEVICE_ENV: 'cpu'}, facts=_facts())
    four = _facts(available=True, device_count=4, visible_devices=None)
    launch.check_launch(4, [], environ={}, facts=four)
    with pytest.raises(UserError, match=r'8 processes per machine .* only 4 GPU\(s\) are visible .* '
                                        r'tools/dist_train.sh CONFIG 4'):
        launch.check_launch(8, [], environ={}, facts=four)


def _fake_tool(folder, name, script):
    path = folder / name
    path.write_text('#!/bin/sh\n' + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_nvidia_smi_is_read_and_its_failure_reported(tmp_path, monkeypatch):
    monkeypatch.setenv('PATH', str(tmp_path))
    assert launch.nvidia_smi_gpus() == (None, None, None)
    _fake_tool(tmp_path, 'nvidia-smi', 'echo "NVIDIA A100-SXM4-80GB, 525.60.13"\n' * 2)
    assert launch.nvidia_smi_gpus() == (['NVIDIA A100-SXM4-80GB'] * 2, '525.60.13', None)
    _fake_tool(tmp_path, 'nvidia-smi', "echo \"NVIDIA-SMI has failed because it couldn't communicate with the "
               'NVIDIA driver."\nexit 9\n')
    gpus, driver, error = launch.nvidia_smi_gpus()
    assert gpus == [] and driver is None and error.startswith('NVIDIA-SMI has failed')


def test_init_distributed_with_cuda_starts_the_group_as_mmengine_would(monkeypatch):
    """With CUDA the group starts before the Runner (for the shared data check), through mmengine's
    init_dist with the config's dist_cfg, which the Runner then finds ready."""
    import mmengine.dist
    calls = []
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(mmengine.dist, 'init_dist', lambda launcher, **kw: calls.append((launcher, kw)))
    monkeypatch.setattr(multiprocessing, 'get_start_method', lambda allow_none=False: 'fork')
    launch.init_distributed('pytorch', Config(dict(env_cfg=dict(dist_cfg=dict(backend='nccl', timeout=60)))))
    assert calls == [('pytorch', dict(backend='nccl', timeout=60))]


# ----------------------------------------------------------------------------------------------
# run_on_rank0_and_share

def _check(path, fail):
    """A stand-in for the data check: counts its calls in ``path``, fails when asked to."""
    with open(path, 'a') as f:
        f.write('x')
    if fail == 'user':
        raise UserError('train_dataloader: 3 of 5 images do not exist')
    if fail == 'bug':
        raise KeyError('oops')
    return 42


def _rank(rank, port, counter, fail, queue):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=port)
    dist.init_process_group('gloo', rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        result = launch.run_on_rank0_and_share(_check, counter, fail)
        queue.put((rank, 'ok', result, dist.is_initialized()))
    except MMPolaUserError as e:
        queue.put((rank, 'user', f'{e} (exit {e.exit_code})', dist.is_initialized()))
    except Exception as e:
        queue.put((rank, type(e).__name__, str(e), dist.is_initialized()))


@pytest.mark.parametrize('fail', [None, 'user', 'bug'])
def test_rank0_check_runs_once_and_every_rank_gets_its_verdict(tmp_path, fail):
    ctx = multiprocessing.get_context('fork')
    queue, counter, port = ctx.Queue(), str(tmp_path / 'calls'), free_port()
    procs = [ctx.Process(target=_rank, args=(rank, port, counter, fail, queue)) for rank in (0, 1)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert open(counter).read() == 'x'  # rank 0 only
    if fail is None:
        assert results == [(0, 'ok', 42, True), (1, 'ok', 42, True)]
    elif fail == 'user':  # the same message and exit status everywhere; the group is left
        expected = 'train_dataloader: 3 of 5 images do not exist (exit 2)'
        assert results == [(0, 'user', expected, False), (1, 'user', expected, False)]
    else:
        assert results[0][:2] == (0, 'KeyError')
        assert results[1][:3] == (1, 'RuntimeError', "rank 0 failed: KeyError: 'oops'")


def test_without_a_process_group_the_check_just_runs(tmp_path):
    assert launch.run_on_rank0_and_share(_check, str(tmp_path / 'calls'), None) == 42
    with pytest.raises(UserError):
        launch.run_on_rank0_and_share(_check, str(tmp_path / 'calls'), 'user')


# ----------------------------------------------------------------------------------------------
# through the tool: a torchrun-style launch where CUDA is not usable stops before any work

@pytest.fixture
def default_port_taken():
    """torchrun's default port (29500) in use while the test runs, as by another run on the machine."""
    with socket.socket() as sock:
        try:
            sock.bind(('127.0.0.1', 29500))
            sock.listen()
        except OSError:  # in use already
            pass
        yield


def test_dist_train_on_cpu_stops_every_rank_with_rank0s_data_error(tmp_path, default_port_taken):
    """Two CPU processes (--device cpu), data missing: rank 0 checks, both exit with its message. No PORT
    given and the default port taken: the processes of one machine meet on a free port."""
    env = dict(os.environ, PYTHONPATH=REPO, PYTHON=sys.executable, OMP_NUM_THREADS='1')
    for name in ('PORT', 'MASTER_ADDR', 'NNODES'):
        env.pop(name, None)
    proc = subprocess.run(['bash', 'tools/dist_train.sh', DEMO_CONFIG, '2', '--device', 'cpu', '--work-dir',
                           str(tmp_path / 'work'), '--cfg-options', 'train_dataloader.dataset.data_root=/nonexistent/'],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith('error: ')]
    assert len(errors) == 2 and errors[0] == errors[1] and '/nonexistent/' in errors[0], proc.stderr[-3000:]
    assert 'train.py", line' not in proc.stderr  # no traceback of ours (torchrun prints its own summary)


@pytest.mark.parametrize('script', ['dist_train.sh', 'dist_test.sh'])
def test_dist_scripts_without_cuda_stop_once_before_torchrun(script, tmp_path):
    """One error line, from the check before torchrun: no process is started, so neither the same line
    per process nor torchrun's failure report follows."""
    env = dict(os.environ, PYTHONPATH=REPO, PYTHON=sys.executable, CUDA_VISIBLE_DEVICES='')
    env.pop(launch.DEVICE_ENV, None)
    args = [DEMO_CONFIG] + (['CHECKPOINT.pth'] if script == 'dist_test.sh' else []) + ['8', '--work-dir',
                                                                                        str(tmp_path / 'work')]
    proc = subprocess.run(['bash', osp.join('tools', script)] + args, cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [
        "error: --launcher pytorch starts one process per GPU, but CUDA is not usable here: CUDA_VISIBLE_DEVICES is "
        "set to '', which hides every GPU from this process. Fix: unset CUDA_VISIBLE_DEVICES, or list the GPUs to "
        "use (e.g. CUDA_VISIBLE_DEVICES=0,1,2,3). To run on the CPU on purpose, add --device cpu (or set "
        "MMPOLA_DEVICE=cpu)."], proc.stderr[-3000:]
    assert proc.stdout == '' and not (tmp_path / 'work').exists()


# tools/dist_*.sh's check before torchrun, as they run it, then whether it imported torch
PRE_CHECK = ('import runpy, sys; sys.argv = ["tools/_mmpola_tools.py"] + sys.argv[1:]; '
             'runpy.run_path("tools/_mmpola_tools.py", run_name="__main__"); print("torch" in sys.modules)')


@pytest.mark.parametrize('args, env, code, out, error', [
    (['2', 'CONFIG', '--device', 'cpu'], {}, 0, 'False', None),  # nothing to check: no torch, no mmpola
    (['2', 'CONFIG', '--device=cpu'], {}, 0, 'False', None),
    (['2', 'CONFIG'], {launch.DEVICE_ENV: 'cpu'}, 0, 'False', None),
    (['0', 'CONFIG', '--device', 'cpu'], {}, 2, '', "the number of processes per machine must be a positive integer, "
                                                    "got '0'"),
    (['x', 'CONFIG'], {launch.DEVICE_ENV: 'cpu'}, 2, '', "the number of processes per machine must be a positive "
                                                         "integer, got 'x'"),
    (['\u00b2', 'CONFIG', '--device', 'cpu'], {}, 2, '', 'the number of processes per machine must be a positive '
                                                           "integer, got '\u00b2'"),  # a digit int() does not read
    (['2', 'CONFIG', '--device', 'cuda'], {'CUDA_VISIBLE_DEVICES': ''}, 2, '', 'CUDA is not usable here')])
def test_launch_check_before_torchrun(args, env, code, out, error):
    """The check that tools/dist_*.sh run once: with the CPU asked for, only the process count is checked, without
    importing torch or mmpola (seconds a launch); a bad process count or an unusable GPU is one error line."""
    environ = {k: v for k, v in os.environ.items() if k != launch.DEVICE_ENV}
    environ.update(PYTHONPATH=REPO, **env)
    proc = subprocess.run([sys.executable, '-c', PRE_CHECK, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=environ)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert proc.stdout.strip() == out
    if error is None:
        assert proc.stderr == ''
    else:
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith('error: ') and error in lines[0], proc.stderr[-3000:]


def _fake_command(tmp_path, name, records='"$@"'):
    """A directory for PATH holding ``name``: a command that adds what it sees (``records``, shell words: by
    default its arguments), one word a line, to ``tmp_path / name``; returns that directory."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / name
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" {records} >> "{tmp_path / name}"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return bin_dir


@pytest.mark.parametrize('script, positional, tool_args', [
    ('slurm_train.sh', ['CONF.py', 'WORK DIR'], ['tools/train.py', 'CONF.py', '--work-dir=WORK DIR']),
    ('slurm_test.sh', ['CONF.py', 'CK.pth'], ['tools/test.py', 'CONF.py', 'CK.pth'])])
@pytest.mark.parametrize('gpus, per_node, expected_per_node', [(16, '8', '8'), (4, None, '4'), (None, None, '8')])
def test_slurm_scripts_start_one_task_per_gpu_through_srun(script, positional, tool_args, gpus, per_node,
                                                           expected_per_node, tmp_path):
    """srun gets the partition, job name, tasks, GPUs per node (by default GPUS, at most 8), CPUs per task and
    SRUN_ARGS, then the tool with its arguments, --launcher=slurm and the options given, each word as given."""
    env = dict(os.environ, PATH=f"{_fake_command(tmp_path, 'srun')}:{os.environ['PATH']}", PYTHON='/opt/py/python',
               SRUN_ARGS='--quotatype=auto --exclusive', CPUS_PER_TASK='6')
    for name, value in (('GPUS', gpus), ('GPUS_PER_NODE', per_node)):
        env.pop(name, None)
        if value is not None:
            env[name] = str(value)
    proc = subprocess.run(['bash', osp.join('tools', script), 'PART', 'JOB', *positional, '--cfg-options', 'a=1 2'],
                          cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    tasks = str(gpus or 8)
    assert (tmp_path / 'srun').read_text().splitlines() == [
        '-p', 'PART', '--job-name=JOB', f'--gres=gpu:{expected_per_node}', f'--ntasks={tasks}',
        f'--ntasks-per-node={expected_per_node}', '--cpus-per-task=6', '--kill-on-bad-exit=1', '--quotatype=auto',
        '--exclusive', '/opt/py/python', '-u', osp.join(osp.realpath(REPO), tool_args[0]), *tool_args[1:],
        '--launcher=slurm', '--cfg-options', 'a=1 2']


def test_a_launch_script_linked_elsewhere_runs_the_repositorys_tool(tmp_path):
    """A link to the script (a user's bin directory) still finds the repository: its tools and its .venv."""
    link = tmp_path / 'slurm_train.sh'
    link.symlink_to(osp.join(REPO, 'tools', 'slurm_train.sh'))
    env = dict(os.environ, PATH=f"{_fake_command(tmp_path, 'srun')}:{os.environ['PATH']}", PYTHON='python3')
    proc = subprocess.run(['bash', str(link), 'PART', 'JOB', 'CONF.py', 'WORK'], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / 'srun').read_text().splitlines()[-5:] == [
        '-u', osp.join(osp.realpath(REPO), 'tools', 'train.py'), 'CONF.py', '--work-dir=WORK', '--launcher=slurm']


def test_slurm_tasks_meet_on_a_port_drawn_per_launch_unless_master_port_is_set(tmp_path):
    """Two jobs whose first node is the same machine would both take torch's 29500: the tasks get a port drawn
    for the launch, below Linux's ephemeral ports; MASTER_PORT given is kept."""
    fake_bin = _fake_command(tmp_path, 'srun', '"$MASTER_PORT"')
    env = dict(os.environ, PATH=f"{fake_bin}:{os.environ['PATH']}")
    env.pop('MASTER_PORT', None)
    for extra in ({}, {}, {}, {'MASTER_PORT': '12345'}):
        proc = subprocess.run(['bash', 'tools/slurm_test.sh', 'PART', 'JOB', 'CONF.py', 'CK.pth'], cwd=REPO,
                              capture_output=True, text=True, timeout=60, env=dict(env, **extra))
        assert proc.returncode == 0, proc.stderr
    *drawn, given = [int(p) for p in (tmp_path / 'srun').read_text().split()]
    assert all(20000 <= p < 32000 for p in drawn) and len(set(drawn)) > 1 and given == 12345


@pytest.mark.parametrize('pythonpath, expected', [(None, f'{osp.realpath(REPO)}:'),
                                                   ('/my/lib', f'{osp.realpath(REPO)}:/my/lib')])
def test_slurm_tasks_import_the_repository_then_the_working_directory_or_pythonpath(pythonpath, expected, tmp_path):
    """The repository first; with PYTHONPATH unset an empty entry follows, which Python reads as the working
    directory: a project's own modules there stay importable for its config's custom_imports (as with mmdet's
    scripts)."""
    fake_bin = _fake_command(tmp_path, 'srun', '"$PYTHONPATH"')
    env = dict(os.environ, PATH=f"{fake_bin}:{os.environ['PATH']}")
    env.pop('PYTHONPATH', None)
    if pythonpath:
        env['PYTHONPATH'] = pythonpath
    proc = subprocess.run(['bash', 'tools/slurm_train.sh', 'PART', 'JOB', 'CONF.py', 'WORK'], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / 'srun').read_text() == expected + '\n'


@pytest.mark.parametrize('script, usage', [
    ('dist_train.sh', 'CONFIG GPUS [tools/train.py options ...]'),
    ('dist_test.sh', 'CONFIG CHECKPOINT GPUS [tools/test.py options ...]'),
    ('slurm_train.sh', 'PARTITION JOB_NAME CONFIG WORK_DIR [tools/train.py options ...]'),
    ('slurm_test.sh', 'PARTITION JOB_NAME CONFIG CHECKPOINT [tools/test.py options ...]')])
def test_launch_scripts_with_too_few_arguments_print_their_usage(script, usage, tmp_path):
    env = dict(os.environ, PATH=f"{_fake_command(tmp_path, 'srun')}:{os.environ['PATH']}")
    proc = subprocess.run(['bash', osp.join('tools', script), 'CONFIG'], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env=env)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, '', f'usage: tools/{script} {usage}\n')
    assert not (tmp_path / 'srun').exists()


def test_train_tool_with_launcher_and_no_cuda_stops_at_once(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, RANK='0', LOCAL_RANK='0', WORLD_SIZE='2', MASTER_ADDR='127.0.0.1',
               MASTER_PORT=free_port(), CUDA_VISIBLE_DEVICES='')
    env.pop(launch.DEVICE_ENV, None)
    proc = subprocess.run([sys.executable, 'tools/train.py', DEMO_CONFIG, '--launcher', 'pytorch',
                           '--work-dir', str(tmp_path / 'work')],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.startswith('error: --launcher pytorch starts one process per GPU, but CUDA is not usable')
    assert '--device cpu' in proc.stderr and 'Traceback' not in proc.stderr
    assert not (tmp_path / 'work').exists()  # nothing was built or written


# ----------------------------------------------------------------------------------------------
# the machine's fallbacks

def _cfg(**kwargs):
    base = dict(
        model=dict(type='Net', head=dict(norm_cfg=dict(type='SyncBN', requires_grad=True)),
                   aux=[dict(norm_cfg=dict(type='MMSyncBN')), dict(norm_cfg=dict(type='BN'))]),
        env_cfg=dict(dist_cfg=dict(backend='nccl')),
        optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-4)),
        sync_bn='torch')
    base.update(kwargs)
    return Config(base)


def test_replace_sync_bn_walks_dicts_and_lists():
    cfg = _cfg()
    assert launch.replace_sync_bn(cfg.model) == 2
    assert cfg.model.head.norm_cfg.type == 'BN' and [a.norm_cfg.type for a in cfg.model.aux] == ['BN', 'BN']


def test_single_process_drops_sync_bn():
    cfg = _cfg()
    notes = launch.adapt_cfg_to_machine(cfg, 'none')
    assert cfg.model.head.norm_cfg.type == 'BN' and 'sync_bn' not in cfg
    assert any('SyncBN' in n for n in notes)


@needs_no_cuda
def test_cpu_distributed_uses_gloo_and_no_device_ids():
    cfg = _cfg(find_unused_parameters=True)
    launch.adapt_cfg_to_machine(cfg, 'pytorch')
    assert cfg.env_cfg.dist_cfg.backend == 'gloo'
    assert cfg.model_wrapper_cfg.device_ids is None and cfg.model_wrapper_cfg.find_unused_parameters
    assert cfg.model.head.norm_cfg.type == 'BN'  # no CPU SyncBN kernel


@needs_no_cuda
def test_amp_on_cpu_is_bf16_and_reloadable():
    cfg = _cfg(custom_imports=dict(imports=['mmpola'], allow_failed_imports=False))
    assert 'bfloat16' in launch.setup_amp(cfg)
    assert cfg.optim_wrapper.type == 'BF16AmpOptimWrapper' and cfg.optim_wrapper.dtype == 'bfloat16'
    assert cfg.custom_imports.imports == ['mmpola', 'mmpola.runtime']  # the dumped config rebuilds it
    with pytest.raises(UserError):
        launch.setup_amp(_cfg(), 'float16')
    # a config written for CUDA AMP runs here too
    cfg = _cfg(optim_wrapper=dict(type='AmpOptimWrapper', loss_scale='dynamic', optimizer=dict(type='SGD', lr=1)))
    launch.adapt_cfg_to_machine(cfg, 'none')
    assert cfg.optim_wrapper.type == 'BF16AmpOptimWrapper' and 'loss_scale' not in cfg.optim_wrapper


def test_slurm_launcher_outside_slurm_is_one_line(tmp_path, capsys, monkeypatch):
    """``--launcher slurm`` run by hand (not through srun): one line with the fix, before anything is built
    (before: ``KeyError: 'SLURM_PROCID'`` from the process group's start)."""
    from mmengine.logging import MMLogger

    from tests.fixtures.tools import load_tool, refused
    from tests.fixtures.toy_runs import toy_config
    MMLogger.get_current_instance()
    for name in launch.SLURM_VARIABLES + ('MASTER_ADDR',):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', os.environ.get('CUDA_VISIBLE_DEVICES', ''))  # --device cpu sets it
    device = [] if torch.cuda.is_available() else ['--device', 'cpu']
    work = tmp_path / 'work'
    err = refused(load_tool('train'), [toy_config(tmp_path), '--work-dir', str(work), '--launcher', 'slurm']
                  + device, capsys, [], str(work))
    assert err == ("--launcher slurm: this process was not started by slurm's srun (SLURM_PROCID, SLURM_NTASKS, "
                   'SLURM_NODELIST are not set). Fix: start it with tools/slurm_train.sh (or tools/slurm_test.sh) '
                   'PARTITION JOB_NAME CONFIG ..., which runs srun; without slurm: tools/dist_train.sh CONFIG GPUS '
                   '(torchrun), or leave out --launcher for one process.')
    # inside a job on a machine without scontrol (and no MASTER_ADDR): the address cannot be found
    env = {'SLURM_PROCID': '0', 'SLURM_NTASKS': '2', 'SLURM_NODELIST': 'node[1-2]', 'PATH': str(tmp_path)}
    with pytest.raises(UserError, match=r'scontrol show hostname node\[1-2\]`, but scontrol is not installed here. '
                                        r'Fix: set MASTER_ADDR'):
        launch.check_slurm_environment(env)
    launch.check_slurm_environment(dict(env, MASTER_ADDR='node1'))


def test_end_distributed_leaves_the_group_and_is_a_no_op_without_one():
    """tools/train.py and tools/test.py end a distributed run by leaving the process group in order
    (gloo can abort a process that leaves it to the interpreter's shutdown)."""
    import torch.distributed as dist
    launch.end_distributed()  # no group: nothing happens
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{free_port()}', rank=0, world_size=1)
    launch.end_distributed()
    assert not dist.is_initialized()
