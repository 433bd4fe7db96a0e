"""run_preflight: every check once, on rank 0 only."""
import os.path as osp

import pytest

from tests.fixtures.paths import REPO

DET_DEMO = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')


def test_only_rank_zero_checks(coco, monkeypatch):
    """With a process group only rank 0 runs the checks (the verdict is shared by
    launch.run_on_rank0_and_share; two real processes: tests/runtime/test_launch.py)."""
    from mmpola.runtime import load_config, preflight, register_task_modules
    cfg = load_config(DET_DEMO, {'train_dataloader.dataset.data_root': f'{coco}/'})
    register_task_modules(cfg)
    shared = []
    monkeypatch.setattr(preflight, 'run_on_rank0_and_share', lambda fn, *a, **k: shared.append(fn))
    monkeypatch.setattr(preflight, 'check_data_files', lambda *a: pytest.fail('checked outside the rank-0 call'))
    preflight.run_preflight(cfg, ['train_dataloader'])
    assert len(shared) == 1
