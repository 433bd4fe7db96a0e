"""The tools' test-time flags (--out, --show-dir, --tta) for each task library."""
import copy
import os.path as osp

import pytest
from mmengine.config import Config

from mmpola.runtime import UserError, enable_test_dump, enable_test_visualization, enable_tta


def test_test_time_adapters_follow_each_library():
    det = Config(dict(test_evaluator=dict(type='CocoMetric'), default_hooks=dict(visualization=dict(draw=False)),
                      visualizer=dict(type='DetLocalVisualizer')))
    enable_test_dump(det, 'out.pkl', 'mmdet')
    # mmdet's DumpDetResults, written atomically (mmpola.runtime.dump_results)
    assert [(e['type'], e.get('dump_type')) for e in det.test_evaluator] == \
        [('CocoMetric', None), ('mmpola.SafeDumpResults', 'mmdet.DumpDetResults')]
    with pytest.raises(UserError):
        enable_test_dump(copy.deepcopy(det), 'out.json', 'mmdet')
    enable_test_visualization(det, 'vis', 'mmdet')
    assert det.default_hooks.visualization.draw and det.default_hooks.visualization.test_out_dir == osp.abspath('vis')

    with pytest.raises(UserError, match=r"^--show / --show-dir draw the predictions through the config's "
                                        r'visualization hook .* Fix: --out FILE keeps the predictions instead'):
        enable_test_visualization(Config(dict(default_hooks=dict())), 'vis', 'mmpola')  # a classification config

    seg = Config(dict(test_evaluator=dict(type='IoUMetric'), default_hooks=dict(visualization=dict(draw=False)),
                      visualizer=dict(type='SegLocalVisualizer'), model=dict(type='EncoderDecoder'),
                      test_dataloader=dict(dataset=dict(pipeline=['plain'])),
                      tta_model=dict(type='SegTTAModel'), tta_pipeline=['tta']))
    enable_test_dump(seg, 'pred_dir', 'mmseg')
    # mmseg's IoUMetric, its folder of maps written atomically (mmpola.runtime.dump_results)
    assert seg.test_evaluator == dict(type='mmpola.SafeOutputDir', metric_type='mmseg.IoUMetric', output_dir='pred_dir')
    enable_test_visualization(seg, 'vis', 'mmseg')
    assert seg.default_hooks.visualization.draw and seg.visualizer.save_dir == 'vis'
    assert seg.default_hooks.visualization.interval == 1  # every image, as for mmdet (mmseg's hook: every 50th)
    enable_tta(seg)
    assert seg.model.type == 'SegTTAModel' and seg.model.module.type == 'EncoderDecoder'
    assert seg.test_dataloader.dataset.pipeline == ['tta']
    with pytest.raises(UserError, match='tta_model'):
        enable_tta(Config(dict(model=dict(type='X'))))


def test_user_error_of_a_running_run_is_printed_once_and_logged(tmp_path, capsys):
    """With the Runner's logger, the error line reaches the terminal once (stderr) and the log file once."""
    import logging

    from mmengine.logging import MMLogger

    from mmpola.runtime.cli import exit_on_user_error
    log_file = tmp_path / 'run.log'
    logger = MMLogger.get_instance('test_cli_user_error', log_file=str(log_file))
    with pytest.raises(SystemExit) as exc, exit_on_user_error(logger):
        raise UserError('the problem and its fix')
    assert exc.value.code == UserError.exit_code
    out, err = capsys.readouterr()
    assert err == 'error: the problem and its fix\n' and 'the problem' not in out
    for handler in logger.handlers:
        handler.flush()
    logged = [line for line in log_file.read_text().splitlines() if 'the problem and its fix' in line]
    assert len(logged) == 1 and ' - ERROR - ' in logged[0] and logged[0].endswith('[mmpola] the problem and its fix')
    assert any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)
               for h in logger.handlers)  # the terminal handler that no longer gets the line


def test_a_training_set_smaller_than_one_batch_is_refused_before_training(tmp_path, capsys):
    """tools/train.py on 6 images with the classification demo's batch of 16, whose loader drops the incomplete last
    batch: one line naming the sizes and the fix (mmengine would stop in its scheduler set-up on an assertion about
    ``epoch_length``); no checkpoint written. With a batch that fits, the same data trains (the check lets it
    through)."""
    from mmpola.classification.demo_imagenet import make_demo_imagenet
    from tests.fixtures.paths import REPO
    from tests.fixtures.tools import load_tool, refused, run_main
    root = str(tmp_path / 'data')
    make_demo_imagenet(root, num_train=1, num_val=1, size=64, seed=0)
    config = osp.join(REPO, 'configs', 'demo', 'pola-pvt_demo-imagenet-64x64.py')
    train = load_tool('train')
    options = [f'data_root={root}/', f'train_dataloader.dataset.data_root={root}/',
               f'val_dataloader.dataset.data_root={root}/', f'test_dataloader.dataset.data_root={root}/',
               'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False']
    message = refused(train, [config, '--work-dir', str(tmp_path / 'work'), '--cfg-options', *options], capsys,
                      work_dir=tmp_path / 'work')
    assert message == ('train_dataloader gives no batch: the training set has 6 samples, fewer than one batch of 16, '
                       'and the loader drops an incomplete last batch (drop_last=True); use a smaller batch '
                       '(--cfg-options train_dataloader.batch_size=N) or more training data'), message
    run_main(train, [config, '--work-dir', str(tmp_path / 'fits'), '--cfg-options', *options,
                     'train_dataloader.batch_size=2', 'train_cfg.max_epochs=1', 'train_cfg.val_interval=1',
                     'param_scheduler=[]', 'default_hooks.checkpoint.interval=1'])
    assert osp.isfile(tmp_path / 'fits' / 'epoch_1.pth')
