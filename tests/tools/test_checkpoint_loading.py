"""tools/train.py and tools/test.py with checkpoints that would load "silently wrong", and tools/test.py
--out on a path that cannot take the predictions, on a tiny generated COCO set with the demo detector
and the golden mini backbones:

* a file of a deeper backbone of the same widths (``init_cfg``, ``load_from``, the test checkpoint,
  ``--resume``):
  one line naming what the file holds and what the model is, instead of a run on the first blocks of
  another model; the blocks both have load only on purpose (``init_cfg.strict=False``,
  ``checkpoint_min_loaded=0``);
* a file holding one NaN weight: one line naming the file and the tensor, instead of an empty result
  set (test) or a non-finite loss blamed on the learning rate (train);
* ``--out`` that is a folder or in a missing folder is refused before the evaluation, and a disk that
  fills while it is written leaves the earlier file as it was.
"""
import errno
import os
import os.path as osp
import pickle
import types

import mmdet  # noqa: F401  (required: a broken install fails here)
import pytest
import torch
from mmengine.logging import MMLogger

from tests.checkpoint.test_layout import ARCH, DEPTHS, EXTRA, official_file
from tests.fixtures.detection import build_detector, load_config
from tests.fixtures.paths import REPO
from tests.fixtures.tools import load_tool, refused, run_main

DEMO_CONFIG = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')
CHANNELS = {'pvt': [16, 32, 80, 128], 'swin': [16, 32, 64, 128]}
TYPE = {'pvt': 'PolaPVT', 'swin': 'PolaSwin'}
TITLE = {'pvt': 'Pola-PVT', 'swin': 'Pola-Swin'}

MMLogger.get_current_instance()  # mmengine's logger keeps the stream it first sees: not a test's capsys
TRAIN, TEST = load_tool('train'), load_tool('test')


def blocks(depths):
    return '-'.join(map(str, depths)) + ' blocks'


@pytest.fixture(scope='module')
def coco(tmp_path_factory):
    from mmpola.datasets import make_demo_coco
    root = tmp_path_factory.mktemp('coco')
    make_demo_coco(str(root), num_train=2, num_val=1, seed=1, image_shapes=((64, 64),), verbose=False)
    return root


def config(root, family, depths, init=None, name=None):
    """The demo detector with a mini backbone of ``depths`` (``init``: its pretrained file) on the tiny
    set: one training iteration, one test image."""
    backbone = dict(type=TYPE[family], arch=dict(ARCH[family], depths=depths), drop_path_rate=0.0,
                    init_cfg=None if init is None else dict(type='Pretrained', checkpoint=init),
                    **(EXTRA if family == 'swin' else {}))
    path = root / f'{name or family + "_" + "".join(map(str, depths))}.py'
    path.write_text(f"""
_base_ = [{DEMO_CONFIG!r}]
data_root = {str(root) + '/'!r}
model = dict(backbone=dict(_delete_=True, **{backbone!r}), neck=dict(in_channels={CHANNELS[family]!r}))
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False, dataset=dict(data_root=data_root))
val_dataloader = None
val_cfg = None
val_evaluator = None
test_dataloader = dict(batch_size=1, num_workers=0, persistent_workers=False, dataset=dict(data_root=data_root))
test_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
train_cfg = dict(max_epochs=1)
""")
    return str(path)


def detector_checkpoint(path, cfg_path, nan_key=None):
    """A detector checkpoint of the config's model (random weights) as tools/train.py writes it."""
    torch.manual_seed(0)
    state = build_detector(load_config(cfg_path)).state_dict()
    if nan_key is not None:
        state[nan_key].view(-1)[0] = float('nan')
    torch.save({'meta': {'epoch': 1, 'iter': 1}, 'state_dict': state}, path)
    return str(path)


def test_train_refuses_a_deeper_backbone_file_as_init_cfg(coco, tmp_path, capsys):
    """(Pola-Swin goes through the same backbone loader: tests/checkpoint/test_layout.py.)"""
    family = 'pvt'
    shallow, deep = DEPTHS[family]
    file, _ = official_file(tmp_path, family, deep, name=f'{family}_deep_official.pth')
    work = tmp_path / 'work'
    err = refused(TRAIN, [config(coco, family, shallow, init=file), '--work-dir', str(work)], capsys,
                  unchanged=[file], work_dir=work)
    assert err.startswith(f'checkpoint {str(file)!r} does not fit {TYPE[family]}: the file holds {TITLE[family]}: '
                          f'{blocks(deep)}, the model is {TITLE[family]}: {blocks(shallow)} '
                          '(other blocks per stage)'), err
    assert "on purpose: strict=False (init_cfg=dict(type='Pretrained', checkpoint=..., strict=False)" in err

    # on purpose: the blocks both have load, the run trains
    run_main(TRAIN, [config(coco, family, shallow, init=file), '--work-dir', str(tmp_path / 'partial'),
                     '--cfg-options', 'model.backbone.init_cfg.strict=False'])
    assert osp.isfile(tmp_path / 'partial' / 'epoch_1.pth')
    assert 'PolaPVT: loaded' in capsys.readouterr().out
    # --resume of that run with the config of the deeper backbone
    resumed = str(tmp_path / 'partial' / 'epoch_1.pth')
    err = refused(TRAIN, [config(coco, family, deep), '--work-dir', str(tmp_path / 'resumed'), '--resume', resumed],
                  capsys, unchanged=[resumed], work_dir=tmp_path / 'resumed')
    assert err.startswith(f"checkpoint '{resumed}' does not fit PolaPVT: the file holds Pola-PVT: "
                          f'{blocks(shallow)}, the model is Pola-PVT: {blocks(deep)} (other blocks per stage); '
                          'loading it, blocks of the model would stay randomly initialised'), err
    # --resume without a file names the work dir's checkpoint it found
    err = refused(TRAIN, [config(coco, family, deep), '--work-dir', str(tmp_path / 'partial'), '--resume'],
                  capsys, unchanged=[resumed])
    assert err.startswith(f"checkpoint '{resumed}' does not fit PolaPVT: the file holds Pola-PVT: "), err


def test_test_and_load_from_refuse_a_deeper_detector_checkpoint(coco, tmp_path, capsys):
    shallow, deep = DEPTHS['pvt']
    checkpoint = detector_checkpoint(tmp_path / 'deep_detector.pth', config(coco, 'pvt', deep))
    shallow_config = config(coco, 'pvt', shallow)
    expected = (f"checkpoint '{checkpoint}' does not fit PolaPVT: the file holds Pola-PVT: {blocks(deep)}, the model "
                f'is Pola-PVT: {blocks(shallow)} (other blocks per stage)')
    err = refused(TEST, [shallow_config, checkpoint, '--work-dir', str(tmp_path / 'test')], capsys, [checkpoint])
    assert err.startswith(expected) and err.endswith('on purpose: --cfg-options checkpoint_min_loaded=0.'), err
    work = tmp_path / 'train'
    err = refused(TRAIN, [shallow_config, '--work-dir', str(work), '--cfg-options', f'load_from={checkpoint}'],
                  capsys, [checkpoint], work_dir=work)
    assert err.startswith(expected), err
    # on purpose
    run_main(TEST, [shallow_config, checkpoint, '--work-dir', str(tmp_path / 'anyway'),
                    '--cfg-options', 'checkpoint_min_loaded=0'])


def test_a_nan_weight_is_named_by_test_and_load_from(coco, tmp_path, capsys):
    shallow, _ = DEPTHS['pvt']
    cfg = config(coco, 'pvt', shallow)
    key = 'backbone.block1.0.attn.qg.weight'
    checkpoint = detector_checkpoint(tmp_path / 'nan_detector.pth', cfg, nan_key=key)
    message = (f"checkpoint '{checkpoint}' holds non-finite weights: 1 of its {{}} floating-point tensors have NaN "
               f'or infinite values ({key} (1 NaN)), so a model loaded from it would predict nothing or train on NaN. '
               'It was written after the training diverged, or the file is damaged: use an earlier checkpoint')
    err = refused(TEST, [cfg, checkpoint, '--work-dir', str(tmp_path / 'test')], capsys, [checkpoint])
    total = err.split(' of its ')[1].split()[0]
    assert err.startswith(message.format(total)), err
    work = tmp_path / 'train'
    err = refused(TRAIN, [cfg, '--work-dir', str(work), '--cfg-options', f'load_from={checkpoint}'], capsys,
                  [checkpoint], work_dir=work)
    assert err.startswith(message.format(total)), err
    # init_cfg: the backbone loader says the same (tests/checkpoint/test_layout.py)


def test_out_is_checked_first_and_written_atomically(coco, tmp_path, capsys, monkeypatch):
    from mmpola.runtime import dump_results
    cfg = config(coco, 'pvt', DEPTHS['pvt'][0])
    checkpoint = detector_checkpoint(tmp_path / 'detector.pth', cfg)
    argv = [cfg, checkpoint, '--work-dir', str(tmp_path / 'work'), '--out']

    (tmp_path / 'folder.pkl').mkdir()
    err = refused(TEST, argv + [str(tmp_path / 'folder.pkl')], capsys)
    assert err == f"--out '{tmp_path}/folder.pkl' is a folder; pass the file to write, e.g. " \
                  f'{tmp_path}/folder.pkl/results.pkl'
    err = refused(TEST, argv + [str(tmp_path / 'missing' / 'results.pkl')], capsys)
    assert err == (f"--out '{tmp_path}/missing/results.pkl': the folder '{tmp_path}/missing' does not exist; create it "
                   f'first (mkdir -p {tmp_path}/missing) or pass a path in an existing folder')
    err = refused(TEST, argv + [str(tmp_path / 'detector.pth' / 'results.pkl')], capsys)
    assert "'detector.pth' is a file, not a folder" not in err and 'is a file, not a folder' in err, err
    assert not osp.exists(tmp_path / 'work'), 'the evaluation ran before --out was checked'

    out = tmp_path / 'results.pkl'
    TEST.main(argv + [str(out)])
    with open(out, 'rb') as f:
        good = pickle.load(f)
    assert len(good) == 1  # one test image
    before = out.read_bytes()

    def disk_full(obj, f):  # half of the pickle reaches the disk, then it is full
        data = pickle.dumps(obj)
        f.write(data[:len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(dump_results, 'pickle', types.SimpleNamespace(dump=disk_full))
    MMLogger.get_instance('disk_full')
    with pytest.raises(SystemExit) as exc:
        TEST.main(argv + [str(out)])
    err = capsys.readouterr().err
    assert exc.value.code == 1 and err.count('\n') == 1 and 'Traceback' not in err, err
    assert err == (f'error: could not write the predictions to {out}: No space left on device (errno 28). Nothing was '
                   f'lost: the earlier {out} is intact and no partial file was left. Free disk space (or pass an '
                   '--out on another disk), then run tools/test.py again.\n')
    assert out.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == sorted(n for n in os.listdir(tmp_path) if not n.endswith('.part'))
