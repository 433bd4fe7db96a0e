"""tools/test.py end to end on the checkpoint of the tiny tools/train.py run: COCO bbox and segm
metrics, --out predictions, --show-dir figures, --tta with masks, --cfg-options data_root (in this process:
what they check is the run's log and files), two CPU processes (tools/dist_test.sh) giving the metrics of one;
a missing checkpoint is one line."""
import os.path as osp
import pickle
import re

import mmdet  # noqa: F401  (required: a broken install fails here)
import numpy as np
import pytest
import torch

from tests.fixtures.bad_data import split_with_float_tiff
from tests.fixtures.paths import PYTHON
from tests.fixtures.runs import DEMO_CONFIG, coco_metrics, free_port, run_tool
from tests.fixtures.tools import load_tool, refused, run_main, run_main_logged


@pytest.fixture(scope='module')
def tested(tiny, trained):
    """tools/test.py CONFIG CHECKPOINT --out --show-dir, in this process (its log as a subprocess's output)."""
    out = trained['work_dir'] / 'predictions.pkl'
    show_dir = trained['work_dir'] / 'show'
    work_dir = trained['work_dir'] / 'test'
    _, log = run_main_logged(load_tool('test'), [tiny['config'], str(trained['work_dir'] / 'epoch_2.pth'),
                                                 '--work-dir', str(work_dir), '--out', str(out), '--show-dir',
                                                 str(show_dir)], work_dir)
    return dict(log=log, out=out, show_dir=show_dir)


def test_test_reports_bbox_and_segm_and_dumps_and_draws_predictions(tested):
    coco_metrics(tested['log'])
    with open(tested['out'], 'rb') as f:
        predictions = pickle.load(f)
    assert len(predictions) == 4
    assert {'bboxes', 'scores', 'labels', 'masks'} <= set(predictions[0]['pred_instances'])
    assert len(list(tested['show_dir'].glob('*.jpg'))) == 4  # ground truth | prediction per image


def test_test_tta_flips_and_scales_with_masks(tiny, trained):
    """--tta: PolaDetTTAModel over the demo config's tta_pipeline (3 scales x 2 flips), bbox and segm."""
    work_dir = trained['work_dir'] / 'test_tta'
    _, log = run_main_logged(load_tool('test'), [tiny['config'], str(trained['work_dir'] / 'epoch_2.pth'),
                                                 '--work-dir', str(work_dir), '--tta'], work_dir)
    assert all(0 <= v <= 1 for v in coco_metrics(log).values())


def test_data_root_option_moves_datasets_and_evaluator(tiny, tmp_path):
    """The demo config (data_root data/demo_coco/) on the tiny data: only --cfg-options data_root. Its
    checkpoint: the demo detector as built (the tiny runs train a narrower backbone)."""
    from tests.fixtures.detection import build_detector, load_config
    checkpoint = tmp_path / 'demo_detector.pth'
    torch.manual_seed(0)
    torch.save(dict(state_dict=build_detector(load_config(DEMO_CONFIG)).state_dict()), checkpoint)
    out = tmp_path / 'predictions.pkl'
    _, log = run_main_logged(load_tool('test'), [DEMO_CONFIG, str(checkpoint), '--work-dir', str(tmp_path), '--out',
                                                 str(out), '--cfg-options', f"data_root={tiny['root']}/",
                                                 'test_dataloader.num_workers=0',
                                                 'test_dataloader.persistent_workers=False'], tmp_path)
    # the evaluator reads the moved file (the Runner dumps its config into the work dir)
    from mmengine.config import Config
    dumped = Config.fromfile(str(tmp_path / osp.basename(DEMO_CONFIG)))
    evaluators = dumped.test_evaluator if isinstance(dumped.test_evaluator, list) else [dumped.test_evaluator]
    coco = [e for e in evaluators if e.type == 'CocoMetric']  # (--out adds a dump evaluator)
    assert [e.ann_file for e in coco] == [f"{tiny['root']}/annotations/instances_val.json"]
    with open(out, 'rb') as f:
        assert len(pickle.load(f)) == 4  # the tiny test set
    assert all(0 <= v <= 1 for v in coco_metrics(log).values())


def test_dist_test_two_processes_matches_one(tiny, trained, tested):
    log = run_tool(['bash', 'tools/dist_test.sh', tiny['config'], str(trained['work_dir'] / 'epoch_2.pth'), '2',
                '--work-dir', str(trained['work_dir'] / 'dist_test'), '--device', 'cpu'],
               env=dict(PYTHON=PYTHON, PORT=free_port(), OMP_NUM_THREADS='1'))
    assert 'Distributed training: True' in log and 'GPU number: 2' in log  # mmengine's wording
    assert coco_metrics(log) == coco_metrics(tested['log'])


def test_missing_checkpoint(tiny, capsys):
    err = refused(load_tool('test'), [tiny['config'], '/nonexistent/epoch_9.pth'], capsys)
    assert '/nonexistent/epoch_9.pth' in err


def _nan_tiff_set(tiny, root, fill=None):
    """The tiny val set with its 2nd image as a float32 TIFF holding 2 NaN pixels (``fill``: written
    in their place instead) and a config testing it in batches of 2, as float images are loaded."""
    tiff, ann_file = split_with_float_tiff(tiny, root, 'val', 1, [(5, 7, 0), (20, 30, 2)],
                                           value=np.nan if fill is None else fill)
    config = root / 'float_images.py'
    config.write_text(f"""_base_ = [{tiny['config']!r}]
test_dataloader = dict(batch_size=2, dataset=dict(data_root={str(root) + '/'!r}, pipeline=[
    dict(type='LoadImageFromFile', color_type='unchanged'), *_base_.test_pipeline[1:]]))
test_evaluator = dict(ann_file={str(ann_file)!r})
""")
    return str(config), tiff


def test_an_image_with_nan_pixels_is_named_and_never_reaches_another_image(tiny, trained, tmp_path, capsys):
    """Batched with a NaN image, the clean image used to get 0 detections (NaN RoI features): by
    default the run stops naming the file; with nonfinite_pixels.action=skip the NaN values are set to 0
    for that image's own prediction, and the other images' predictions equal those of a run where the
    file holds 0 in place of NaN."""
    checkpoint = str(trained['work_dir'] / 'epoch_2.pth')
    config, tiff = _nan_tiff_set(tiny, tmp_path / 'nan')
    test = load_tool('test')
    err = refused(test, [config, checkpoint, '--work-dir', str(tmp_path / 'stop')], capsys)
    # (2 NaN pixels in the file; resizing spreads them over their neighbours)
    assert re.match(f'test_dataloader: batch 1: 1 input image with non-finite pixel values: {re.escape(str(tiff))}: '
                    r'\d+ NaN pixel values\. Such an image makes the training losses NaN and, in a batch, blanks the '
                    'predictions of the other images too', err), err
    assert 'Fix: repair or remove the file, or go on without such images: --cfg-options nonfinite_pixels.action=skip' \
        in err

    predictions = {}
    for name, cfg_path, options in (('skip', config, ['--cfg-options', 'nonfinite_pixels.action=skip']),
                                    ('zeros', _nan_tiff_set(tiny, tmp_path / 'zeros', fill=0.0)[0], [])):
        out = tmp_path / f'{name}.pkl'
        run_main(test, [cfg_path, checkpoint, '--work-dir', str(tmp_path / name), '--out', str(out)] + options)
        with open(out, 'rb') as f:
            predictions[name] = [p['pred_instances'] for p in pickle.load(f)]
    assert re.search(f'{re.escape(str(tiff))}: \\d+ NaN pixel values: set to 0 for its prediction '
                     r'\(nonfinite_pixels.action=skip\)', capsys.readouterr().out)
    skipped, zeros = predictions['skip'], predictions['zeros']
    assert len(skipped) == 4 and len(skipped[0]['scores']) > 0  # the clean image of the NaN image's batch
    assert len(skipped[1]['scores']) > 0 and torch.isfinite(skipped[1]['bboxes']).all()  # the NaN image itself
    for i in (0, 2, 3):  # the other images: as next to a finite image of the same size
        assert torch.equal(skipped[i]['labels'], zeros[i]['labels'])
        assert torch.allclose(skipped[i]['bboxes'], zeros[i]['bboxes'], atol=1e-3)
