"""UperNet + Pola-Swin-T end to end on a tiny generated ADE-style dataset: tools/train.py (in a subprocess) and
tools/test.py (whole image, --out, --tta; in this process) with IoUMetric, the data generator, and the demo
script."""
import json
import os
import os.path as osp
import re
import subprocess
import sys

import cv2
import mmseg  # noqa: E402,F401  (required: a broken install fails here)
import numpy as np
import pytest
import torch

from tests.fixtures.segmentation import REPO, load_config
from tests.fixtures.tools import demo_that_did_not_learn, load_tool, run_main_logged

PYTHON = sys.executable
DEMO_CONFIG = osp.join(REPO, 'configs', 'demo', 'upernet_pola-swin-t_demo-ade-128x128.py')
MIOU_RE = re.compile(r'mIoU: (-?[0-9.]+)')


def _run(cmd, timeout=300):
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, f'{cmd} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}'
    return proc.stdout + proc.stderr


def _test_in_process(argv, work_dir):
    """The log of tools/test.py ``argv --work-dir work_dir``, run in this process (what the tests check is the run's
    log and files; tools/train.py runs in a process of its own, as a user's run)."""
    return run_main_logged(load_tool('test'), [*argv, '--work-dir', str(work_dir)], work_dir)[1]


def _miou(log):
    found = MIOU_RE.findall(log)
    assert found, log[-3000:]
    return float(found[-1])


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    """8 training / 4 validation images of 64 px rows; the demo config trained for 4 iterations."""
    from mmpola.datasets.demo_ade import make_demo_ade
    root = tmp_path_factory.mktemp('tiny_ade')
    make_demo_ade(str(root), num_train=8, num_val=4, size=64, seed=1)
    config = root / 'tiny_demo.py'
    config.write_text(f"""
_base_ = [{DEMO_CONFIG!r}]
data_root = {str(root)!r}
crop_size = (64, 64)
model = dict(data_preprocessor=dict(size=crop_size))
train_dataloader = dict(batch_size=2, dataset=dict(
    data_root=data_root,
    pipeline=[dict(type='LoadImageFromFile'),
              dict(type='LoadAnnotations', reduce_zero_label=True),
              dict(type='RandomCrop', crop_size=crop_size),
              dict(type='PackSegInputs')]))
val_dataloader = dict(dataset=dict(data_root=data_root))
test_dataloader = val_dataloader
train_cfg = dict(max_iters=4, val_interval=4)
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=4)]
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=4))
""")
    return dict(root=root, config=str(config))


def test_generator_is_deterministic_and_ade_like(tiny, tmp_path):
    from mmpola.datasets.demo_ade import DEMO_ADE_CLASSES, demo_ade_is_complete, make_demo_ade
    root = tiny['root']
    assert demo_ade_is_complete(str(root), num_train=8, num_val=4, size=64, seed=1)
    assert not demo_ade_is_complete(str(root), num_train=9, num_val=4, size=64, seed=1)
    # image i depends only on (seed, split, i): a smaller run reproduces the first files exactly
    make_demo_ade(str(tmp_path), num_train=2, num_val=1, size=64, seed=1)
    for rel in ('images/training/demo_ade_00001.jpg', 'annotations/training/demo_ade_00001.png',
                'annotations/validation/demo_ade_00000.png'):
        with open(root / rel, 'rb') as a, open(tmp_path / rel, 'rb') as b:
            assert a.read() == b.read(), rel
    labels = np.stack([cv2.imread(str(p), cv2.IMREAD_UNCHANGED)[:, :64]
                       for p in sorted((root / 'annotations' / 'training').glob('*.png'))])
    image = cv2.imread(str(root / 'images' / 'training' / 'demo_ade_00000.jpg'))
    assert labels.dtype == np.uint8 and image.shape[0] == 64 and image.shape[2] == 3
    # ADE convention: 0 = other (ignored), classes 1..K
    assert labels.max() <= len(DEMO_ADE_CLASSES) and (labels == 0).any()
    for scene in labels:  # every scene: sky above a ground of grass, road or water
        assert 1 in scene and {4, 5, 6} & set(np.unique(scene))


def test_demo_config_metainfo_matches_the_generator():
    from mmpola.datasets.demo_ade import DEMO_ADE_CLASSES, DEMO_ADE_PALETTE
    cfg = load_config(DEMO_CONFIG)
    for loader in (cfg.train_dataloader, cfg.val_dataloader, cfg.test_dataloader):
        dataset = loader.dataset
        assert tuple(dataset.metainfo.classes) == DEMO_ADE_CLASSES
        assert [list(c) for c in dataset.metainfo.palette] == DEMO_ADE_PALETTE
        assert dataset.reduce_zero_label
    assert cfg.model.decode_head.num_classes == cfg.model.auxiliary_head.num_classes == len(DEMO_ADE_CLASSES)
    assert cfg.model.backbone.type == 'PolaSwin' and cfg.model.backbone.arch == 'tiny'


@pytest.fixture(scope='module')
def trained(tiny, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp('train')
    log = _run([PYTHON, 'tools/train.py', tiny['config'], '--work-dir', str(work_dir)])
    assert 'Iter(train) [4/4]' in log
    assert osp.isfile(work_dir / 'iter_4.pth')
    return dict(work_dir=work_dir, log=log)


def test_train_validates_with_iou_metric(trained):
    assert 0 <= _miou(trained['log']) <= 100  # the validation after the last iteration


def test_test_reports_miou_and_writes_prediction_maps(tiny, trained):
    out = trained['work_dir'] / 'pred_maps'
    log = _test_in_process([tiny['config'], str(trained['work_dir'] / 'iter_4.pth'), '--out', str(out)],
                           trained['work_dir'] / 'test')
    # same weights and data as the validation at the end of training -> the same mIoU
    assert _miou(log) == pytest.approx(_miou(trained['log']), abs=0.01)
    maps = sorted(out.glob('*.png'))
    assert len(maps) == 4
    pred = cv2.imread(str(maps[0]), cv2.IMREAD_UNCHANGED)
    truth = cv2.imread(str(tiny['root'] / 'annotations' / 'validation' / maps[0].name), cv2.IMREAD_UNCHANGED)
    assert pred.shape == truth.shape  # full resolution, ADE label values (1..K, reduce_zero_label undone)
    assert pred.min() >= 1 and pred.max() <= 8


def test_test_tta_multi_scale_flip(tiny, trained):
    """--tta: mmseg's SegTTAModel over the config's tta_pipeline (6 scales x flip), still IoUMetric."""
    log = _test_in_process([tiny['config'], str(trained['work_dir'] / 'iter_4.pth'), '--tta'],
                           trained['work_dir'] / 'test_tta')
    assert 0 <= _miou(log) <= 100


def test_data_root_option_moves_every_dataset(tiny, trained):
    """The demo config (data_root data/demo_ade) on the tiny data, with only --cfg-options data_root:
    the same mIoU as the tiny config (same weights, images and test pipeline)."""
    log = _test_in_process([DEMO_CONFIG, str(trained['work_dir'] / 'iter_4.pth'), '--cfg-options',
                            f"data_root={tiny['root']}"], trained['work_dir'] / 'test_data_root')
    assert _miou(log) == pytest.approx(_miou(trained['log']), abs=0.01)


def test_demo_script_runs_and_writes_summary_and_figure(tiny, tmp_path):
    demo = load_tool('demo_segmentation')
    work_dir = tmp_path / 'demo'
    data_root = tmp_path / 'data'
    threads = str(torch.get_num_threads())  # keep this process's setting for the other tests
    summary = demo.main(['--data-root', str(data_root), '--work-dir', str(work_dir), '--num-train', '4',
                         '--num-val', '2', '--size', '64', '--iters', '2', '--num-figure-images', '2',
                         '--threads', threads])
    assert summary['iterations'] == 2
    for when in ('before', 'after'):
        assert 0 <= summary[when]['mIoU'] <= 100
    with open(work_dir / 'summary.json') as f:
        assert json.load(f)['after'] == summary['after']
    figure = cv2.imread(str(work_dir / 'predictions.png'))
    assert figure is not None and figure.shape[1] >= 4 * 64


def test_demo_default_run_that_did_not_learn_exits_with_one_line_after_writing_its_results(tmp_path, monkeypatch):
    """The default run (no --iters) checks that the model learned, as the detection and classification demos do:
    under the minimum it exits 1 with one line naming the metric, once the summary and the figure are written
    (shortened to two iterations, with a minimum no run reaches: :func:`demo_that_did_not_learn`)."""
    demo = load_tool('demo_segmentation')
    work_dir = tmp_path / 'demo'
    demo_that_did_not_learn(demo, ['--data-root', str(tmp_path / 'data'), '--work-dir', str(work_dir), '--num-train',
                                   '4', '--num-val', '2', '--size', '64', '--num-figure-images', '2', '--threads',
                                   str(torch.get_num_threads())], 'iters', 2, monkeypatch)
    with open(work_dir / 'summary.json') as f:
        assert json.load(f)['iterations'] == 2
    assert cv2.imread(str(work_dir / 'predictions.png')) is not None


def test_out_folder_is_written_atomically_and_kept_on_a_failure(tiny, tmp_path, capsys, monkeypatch):
    """tools/test.py --out DIR (mmseg's maps): written into a temporary folder beside DIR, which replaces DIR
    once the evaluation is complete; a disk that fills while the maps are written leaves an earlier DIR as it
    was (one ``error:`` line, exit 1) and no partial folder."""
    import errno

    from mmengine.logging import MMLogger
    from PIL import Image

    from tests.fixtures.segmentation import build_segmentor
    from tests.fixtures.tools import digest
    checkpoint = tmp_path / 'weights.pth'
    torch.save(dict(state_dict=build_segmentor(load_config(tiny['config']).model).state_dict()), checkpoint)
    out = tmp_path / 'pred_maps'
    out.mkdir()
    (out / 'stale.png').write_bytes(b'a map of an earlier run')
    test = load_tool('test')
    argv = [tiny['config'], str(checkpoint), '--work-dir', str(tmp_path / 'work'), '--out', str(out)]
    MMLogger.get_instance('out_folder')
    test.main(argv)
    maps = sorted(p.name for p in out.iterdir())
    assert len(maps) == 4 and 'stale.png' not in maps  # the folder replaced whole
    assert sorted(os.listdir(tmp_path)) == ['pred_maps', 'weights.pth', 'work']  # nothing left beside it
    before = digest(out)

    saved = []
    real_save = Image.Image.save

    def disk_full(self, fp, *args, **kwargs):  # the disk is full at the second map
        if len(saved) == 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        saved.append(fp)
        return real_save(self, fp, *args, **kwargs)

    monkeypatch.setattr(Image.Image, 'save', disk_full)
    MMLogger.get_instance('out_folder_full')
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        test.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 1 and err.count('\n') == 1 and 'Traceback' not in err, err
    assert err == (f'error: could not write the prediction maps to {out}: No space left on device (errno 28). Nothing '
                   f'was lost: the earlier {out} is intact and no partial folder was left. Free disk space (or pass '
                   'an --out on another disk), then run tools/test.py again.\n')
    assert digest(out) == before
    assert sorted(os.listdir(tmp_path)) == ['pred_maps', 'weights.pth', 'work']
