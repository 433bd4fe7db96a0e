"""The CPU allocator settings of mmpola's tools (mmpola.runtime.allocator): on by default, with opt-outs."""
import os
import os.path as osp
import subprocess
import sys

import pytest

from tests.fixtures.paths import REPO


def _tune_in_subprocess(env_extra):
    """tune_malloc() result in a fresh interpreter (the setting is per process)."""
    allocator = osp.join(REPO, 'mmpola', 'runtime', 'allocator.py')
    code = ('import importlib.util, sys; '
            f"spec = importlib.util.spec_from_file_location('alloc', {allocator!r}); "
            'm = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); '
            'print(m.tune_malloc()); print(m.tune_malloc())')
    env = {k: v for k, v in os.environ.items() if not (k.startswith('MALLOC_') and k.endswith('_'))}
    env.update(env_extra)
    out = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True, check=True)
    first, second = out.stdout.strip().splitlines()
    assert first == second  # idempotent
    return first


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc mallopt')
def test_malloc_tuning_on_by_default_with_opt_outs():
    assert _tune_in_subprocess({}).startswith('on')
    assert _tune_in_subprocess({'MMPOLA_MALLOC_TUNING': '0'}).startswith('off')
    assert _tune_in_subprocess({'MALLOC_TOP_PAD_': '1048576'}).startswith('left to the environment')
