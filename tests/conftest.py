"""Settings and fixtures shared by the whole suite (the golden reference data of tests/data)."""
import os
import os.path as osp

# OpenMP's default busy-waiting makes torch many times slower when the cores are shared with other
# processes. Must be set before torch loads (tools/_mmpola_tools.py does the same for the tools).
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')

import pytest  # noqa: E402
import torch  # noqa: E402

# Without a GPU, the 'triton' implementations of the attention ops run through Triton's CPU interpreter
# (same arithmetic, slowly); it is read when the kernels are defined, so it is set before mmpola loads.
# The GPU checks in fp16 / bf16 live with the ops tests (tests/ops: each op's Triton kernels in
# test_<op>_triton.py); they run on the CPU through this interpreter while no GPU is present. The model
# tests check mixed precision with CPU bf16 autocast only.
if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')
else:
    # On a GPU each tunable kernel would compile and time all its configs at every new head dim and dtype
    # (hundreds of compilations over tests/ops); the suite runs the launch code's default configs, the
    # tests of every config force each one, and tests/ops/test_triton_support.py tunes.
    os.environ.setdefault('MMPOLA_TRITON_AUTOTUNE', '0')

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DATA = osp.join(REPO_ROOT, 'tests', 'data')


def data_path(name):
    """Path of a file in tests/data; the test fails (never skips) when it is missing."""
    path = osp.join(DATA, name)
    if not osp.isfile(path):
        pytest.fail(f'golden file {path} is missing (restore tests/data from the repository)')
    return path


@pytest.fixture(scope='session')
def data_file():
    """``data_file(name)``: path of a file in tests/data (fails clearly when it is missing)."""
    return data_path


def pytest_configure(config):
    if os.environ.get('TRITON_INTERPRET') == '1':  # stop in one line where the interpreter cannot run the kernels
        import numpy
        import triton

        from tests.fixtures.interpreter import interpreter_problem
        problem = interpreter_problem(numpy.__version__, triton.__version__)
        if problem:
            raise pytest.UsageError(problem)
    from tests.fixtures import yaml_cache
    yaml_cache.install()  # configs' mmdet:: / mmseg:: bases: each model-index metafile parsed once per process


@pytest.fixture(autouse=True)
def _no_compile(monkeypatch):
    """Keep the attention cores eager: a torch.compile build costs seconds per new shape on a CPU.
    Tests of the compiled kernels remove the variable themselves; subprocesses inherit it."""
    monkeypatch.setenv('MMPOLA_NO_COMPILE', '1')


@pytest.fixture(autouse=True)
def _no_stale_logger():
    """After each test, a logger of the live output streams if mmengine's latest writes to a closed one. Each
    mmengine logger keeps the streams it saw when it was made, and what is logged outside a Runner goes to the
    latest: one made under ``capsys`` (a Runner, a tool's run) would write every later test's logging to that
    test's closed capture, a "Logging error" traceback on stderr. Torn down after ``capsys``, which restores
    the streams first."""
    yield
    import sys
    if 'mmengine.logging' not in sys.modules:
        return
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    if any(getattr(getattr(h, 'stream', None), 'closed', False) for h in logger.handlers):
        from tests.fixtures.tools import live_logger
        live_logger()


_GOLDEN_CACHE = {}


def golden_mini(name):
    """``(expected, official checkpoint path)`` of the golden mini model ``name`` (e.g. 'pola_pvt'; the
    InLine-DeiT ones with their size: 'inline_deit_mini_224').

    ``expected`` holds 'input', 'stages', 'logits' and the official 'constructor' kwargs, made by
    the official implementation; ``<name>_mini_official.pth`` is its official-format checkpoint.
    """
    if name not in _GOLDEN_CACHE:
        from mmpola.checkpoint.reading import safe_torch_load
        stem = name if '_mini' in name else f'{name}_mini'
        _GOLDEN_CACHE[name] = (safe_torch_load(data_path(f'{stem}_expected.pth')), data_path(f'{stem}_official.pth'))
    return _GOLDEN_CACHE[name]


@pytest.fixture(scope='session')
def golden_data():
    """``golden_data(name)``: :func:`golden_mini` (e.g. ``golden_data('flatten_pvt')``)."""
    return golden_mini


@pytest.fixture(scope='session')
def golden():
    """{'pvt' | 'swin': (expected dict, official checkpoint path)} of the Pola mini models."""
    return {family: golden_mini(f'pola_{family}') for family in ('pvt', 'swin')}


@pytest.fixture(scope='session')
def tiny(tmp_path_factory):
    """Tiny COCO set (4 train / 4 val images of 64 px) and the demo detector for it (2 epochs x 2
    iterations); see :func:`tests.fixtures.runs.make_tiny_coco`."""
    from tests.fixtures.runs import make_tiny_coco
    return make_tiny_coco(tmp_path_factory.mktemp('tiny_coco'))
