"""The demos' shared course (mmpola.runtime.demo): what the demo configs run, the initial evaluation added."""
import os.path as osp

import pytest
from mmengine.config import Config

from tests.fixtures.paths import REPO

DEMOS = {'detection': 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py',
         'segmentation': 'upernet_pola-swin-t_demo-ade-128x128.py',
         'classification': 'pola-pvt_demo-imagenet-64x64.py'}


@pytest.mark.parametrize('name', sorted(DEMOS))
def test_demo_configs_carry_the_run_time_guarantees(name):
    """The demos use what their configs name (SafeCheckpointHook, RandomStateHook, NonFiniteLossHook,
    CheckpointFitHook) and add only the initial evaluation (tools/demo_*.py: prepare_demo_config)."""
    from mmpola.runtime import load_config
    from mmpola.runtime.config_check import runtime_hook_notes
    with open(osp.join(REPO, 'tools', f'demo_{name}.py')) as f:
        assert 'demo.prepare_demo_config(cfg' in f.read(), name
    cfg = load_config(osp.join(REPO, 'configs', 'demo', DEMOS[name]))
    assert runtime_hook_notes(cfg) == []
    assert cfg.default_hooks.checkpoint.type == 'mmpola.SafeCheckpointHook'


def test_prepare_demo_config_adds_the_initial_evaluation_only(tmp_path):
    from mmpola.runtime.demo import prepare_demo_config
    cfg = Config(dict(model=dict(type='mmpola.PolaPVT', arch='tiny'), data_root='data/toy/',
                      custom_hooks=[dict(type='mmpola.NonFiniteLossHook')]))
    notes = prepare_demo_config(cfg, str(tmp_path), str(tmp_path), seed=0)
    assert [h['type'] for h in cfg.custom_hooks] == ['mmpola.NonFiniteLossHook', 'mmpola.InitialEvaluationHook']
    assert notes[0].startswith('op implementations: MMPOLA_DEPTHWISE_CONV=')  # logged by the Runner (run_demo)


def test_check_learned_passes_a_run_that_learned_and_names_what_fell_short():
    from mmpola.runtime.demo import check_learned
    minimums = {'box mAP': 0.3, 'mask mAP': 0.3}
    check_learned('tools/demo_detection.py', {'box mAP': 0.547, 'mask mAP': 0.31}, minimums, 'work')
    with pytest.raises(SystemExit) as failed:
        check_learned('tools/demo_detection.py', {'box mAP': 0.547, 'mask mAP': 0.12}, minimums, 'work')
    message = str(failed.value)
    assert message.startswith('tools/demo_detection.py: the trained model did not learn: mask mAP 0.12 '
                              '(minimum 0.3)') and 'box mAP' not in message and '\n' not in message
    with pytest.raises(SystemExit, match='accuracy/top1 nan'):  # a metric missing from the results fails
        check_learned('tools/demo_classification.py', {}, {'accuracy/top1': 60.0}, 'work')
