"""Wrong checkpoints and files say what is wrong, through tools/train.py and tools/test.py.

* a checkpoint that fits (almost) none of the model (a classification file, a segmentor for a
  detector) is refused when it is loaded (``CheckpointFitHook``), with the counts and what the file
  looks like, instead of training from scratch or testing random weights with exit status 0;
* unreadable checkpoint files (truncated zip or pickle, text, empty, a directory, a URL without
  network) name the file and the problem on every path: tools/test.py CHECKPOINT, load_from,
  --resume, a backbone's init_cfg, timm's checkpoint_path;
* a misspelled type or argument in a config is one line with the close matches.

Every refusal exits with status 2, one ``error:`` line, and leaves the files as they were.
"""
import hashlib
import os
import os.path as osp

import pytest
import timm
import torch
import torch.nn as nn
from mmengine.logging import MMLogger

import mmpola.classification  # noqa: F401  (registers the timm models)
from mmpola.checkpoint import describe_checkpoint
from mmpola.checkpoint.safe_load import CheckpointFileError, MissingCheckpointError, safe_torch_load
from mmpola.runtime.checkpoint_fit import checkpoint_fit
from tests.fixtures.paths import REPO  # noqa: E402
from tests.fixtures.tools import load_tool

DATA = osp.join(REPO, 'tests', 'data')
DET_DEMO = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')

MMLogger.get_current_instance()  # mmengine's logger keeps the stream it first sees: not a test's capsys


TRAIN, TEST = load_tool('train'), load_tool('test')


def _sha(path):
    if osp.isdir(path):
        return sorted(os.listdir(path))
    with open(path, 'rb') as f:
        return hashlib.sha1(f.read()).hexdigest()


def _refused(tool, argv, capsys, keep=(), work_dir=None):
    """tool.main(argv) must exit 2 with one error line and leave ``keep`` unchanged, no checkpoint written."""
    before = {p: _sha(p) for p in keep}
    with pytest.raises(SystemExit) as exc:
        tool.main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err[-3000:]
    assert err.startswith('error: ') and 'Traceback' not in err, err[-3000:]
    assert err.count('\n') == 1, err
    assert {p: _sha(p) for p in keep} == before, 'a refused run changed a file'
    if work_dir is not None:
        assert not any(n.endswith('.pth') for _, _, files in os.walk(work_dir) for n in files)
    return err[len('error: '):].strip()


@pytest.fixture(scope='module')
def coco(tmp_path_factory):
    from mmpola.datasets import make_demo_coco
    root = tmp_path_factory.mktemp('wrong_ckpt_coco')
    make_demo_coco(str(root), num_train=2, num_val=2, seed=1, image_shapes=((64, 64),), verbose=False)
    return root


def _opts(root):
    return ['--cfg-options'] + [f'{key}.dataset.data_root={root}/' for key in
                                ('train_dataloader', 'val_dataloader', 'test_dataloader')] + [
        f'val_evaluator.ann_file={root}/annotations/instances_val.json',
        f'test_evaluator.ann_file={root}/annotations/instances_val.json',
        'train_dataloader.batch_size=1',
        'val_cfg=None', 'val_dataloader=None', 'val_evaluator=None']


# ------------------------------------------------------------------------------------------------
# checkpoints of another model

def test_test_tool_refuses_a_classification_checkpoint(coco, tmp_path, capsys):
    official = osp.join(DATA, 'pola_pvt_mini_official.pth')
    work = tmp_path / 'work'
    opts = [o for o in _opts(coco) if not o.startswith('val')]
    err = _refused(TEST, [DET_DEMO, official, '--work-dir', str(work)] + opts, capsys, [official])
    assert err.startswith(f"checkpoint '{official}' does not fit the MaskRCNN (PolaPVT backbone): only 0 of its ")
    assert '(0.0% of ' in err and 'less than the 50% required, so the run would use random weights' in err
    assert 'The file looks like an official classification checkpoint, 10-class head (PolaFormer PVT).' in err
    assert "Fix: a classification or backbone checkpoint holds the backbone only: train with it as the backbone's " \
           'pretrained weights (--cfg-options model.backbone.init_cfg.type=Pretrained' in err
    assert err.endswith('To load it anyway: --cfg-options checkpoint_min_loaded=0')


def test_load_from_a_segmentor_checkpoint_is_refused_before_training(coco, tmp_path, capsys):
    segmentor = tmp_path / 'upernet.pth'
    torch.save({'meta': {}, 'state_dict': {'backbone.layers.0.blocks.0.attn.power': torch.zeros(1, 3, 1, 32),
                                           'backbone.layers.0.blocks.0.attn.qkvg.weight': torch.zeros(4, 4),
                                           'decode_head.conv_seg.weight': torch.zeros(8, 64, 1, 1)}}, segmentor)
    work = tmp_path / 'work'
    err = _refused(TRAIN, [DET_DEMO, '--work-dir', str(work)] + _opts(coco) + [f'load_from={segmentor}'],
                   capsys, [segmentor], work)
    assert 'does not fit the MaskRCNN (PolaPVT backbone): only 0 of its' in err
    assert 'looks like an mmseg segmentor checkpoint (PolaFormer Swin). Fix: use a checkpoint of this MaskRCNN' in err


def test_describe_checkpoint_and_fit_counts():
    z = torch.zeros(2, 2)
    flatten = {'model': {'block1.0.attn.scale': z, 'block1.0.attn.dwc.weight': z, 'head.weight': torch.zeros(5, 2)},
               'config': {}}
    assert describe_checkpoint(flatten) == \
        'an official classification checkpoint, 5-class head (FLatten Transformer PVT)'
    inline = {'layers.0.blocks.0.attn.residual.0.weight': z, 'head.weight': torch.zeros(3, 2)}
    assert describe_checkpoint(inline) == 'a classification checkpoint, 3-class head (InLine Swin)'
    polapp = {'model': {'layers.0.blocks.0.attn.qkvg.weight': z, 'layers.0.blocks.0.attn.s1': z}}
    assert describe_checkpoint(polapp) == 'a backbone-only checkpoint (PolaFormer++)'
    detector = {'state_dict': {'backbone.block1.0.attn.power': z, 'roi_head.bbox_head.fc_cls.weight': z}}
    assert describe_checkpoint(detector) == 'an mmdet detector checkpoint (PolaFormer PVT)'
    assert describe_checkpoint({'epoch': 3}) == "no weights (top-level keys ['epoch'])"

    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))  # 15 + 8 weights
    state = {'module.0.weight': torch.zeros(3, 4), '0.bias': torch.zeros(3), '1.weight': torch.zeros(5, 3)}
    assert checkpoint_fit(model, {'state_dict': state}) == (15, 23, 2, 4)  # wrong shape of 1.weight: not loaded


# ------------------------------------------------------------------------------------------------
# unreadable files

def _bad_files(tmp_path):
    good = tmp_path / 'good.pth'
    torch.save({'state_dict': {'w': torch.zeros(256)}}, good)
    data = good.read_bytes()
    legacy = tmp_path / 'legacy.pth'
    torch.save({'state_dict': {'w': torch.zeros(256)}}, legacy, _use_new_zipfile_serialization=False)
    files = {'truncated.pth': data[:len(data) // 2], 'text.pth': b'epoch 12, mAP 0.41\n',
             'lfs.pth': b'version https://git-lfs.github.com/spec/v1\noid sha256:00\n', 'empty.pth': b'',
             'legacy_truncated.pth': legacy.read_bytes()[:600]}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    (tmp_path / 'run').mkdir()
    (tmp_path / 'run' / 'epoch_1.pth').write_bytes(data)
    return {name.split('.')[0]: str(tmp_path / name) for name in files} | {'directory': str(tmp_path / 'run')}


EXPECTED = {
    'truncated': r"is a truncated or damaged zip archive \(\d+ bytes, no end record\): an interrupted download or "
                 r'copy; download or copy it again',
    'text': r"is not a PyTorch checkpoint: a text file starting with 'epoch 12, mAP 0.41': download or copy the "
            r'checkpoint again',
    'lfs': r'is not a PyTorch checkpoint: a Git LFS pointer, not the file itself: fetch it with `git lfs pull`',
    'empty': r'is empty \(0 bytes\): an interrupted download or copy; download or copy it again',
    'legacy_truncated': r'is truncated or damaged \(.*\): an interrupted download or copy',
    'directory': r"is a directory \(it holds epoch_1.pth\); pass the checkpoint file inside it",
}


def test_unreadable_checkpoints_are_named_by_every_loader(tmp_path):
    from mmengine.runner import CheckpointLoader
    files = _bad_files(tmp_path)
    for name, path in files.items():
        for load in (safe_torch_load, CheckpointLoader.load_checkpoint):
            with pytest.raises(CheckpointFileError, match=f"'{path}' " + EXPECTED[name]):
                load(path)
        with pytest.raises(CheckpointFileError, match=f"'{path}' " + EXPECTED[name]):
            timm.create_model('pola_pvt_tiny', checkpoint_path=path)  # timm's own reader
    with pytest.raises(MissingCheckpointError, match='does not exist'):
        timm.create_model('pola_pvt_tiny', checkpoint_path=str(tmp_path / 'nope.pth'))
    # a URL without network: the download failed, and how to pass a local file instead
    for load in (CheckpointLoader.load_checkpoint, safe_torch_load_url):
        with pytest.raises(CheckpointFileError, match=r"downloading checkpoint 'http://127\.0\.0\.1:9/w\.pth' failed "
                                                      r'\(URLError: .*\)\. Without network access, download it on '
                                                      r'another machine and pass the local file'):
            load('http://127.0.0.1:9/w.pth')


def safe_torch_load_url(url):
    from mmpola.checkpoint import read_checkpoint
    return read_checkpoint(url)


def test_unreadable_checkpoints_through_the_tools(coco, tmp_path, capsys):
    files = _bad_files(tmp_path)
    work = str(tmp_path / 'work')
    test_opts = [o for o in _opts(coco) if not o.startswith('val')]
    for name in ('truncated', 'text', 'empty', 'directory'):
        err = _refused(TEST, [DET_DEMO, files[name], '--work-dir', work] + test_opts, capsys, [files[name]], work)
        assert err.startswith(f"checkpoint: checkpoint{' file' if name != 'directory' else ''} '{files[name]}' ")
    err = _refused(TRAIN, [DET_DEMO, '--work-dir', work, '--resume', files['directory']] + _opts(coco), capsys,
                   [files['directory']], work)
    assert err.startswith(f"--resume checkpoint: checkpoint '{files['directory']}' is a directory")
    err = _refused(TRAIN, [DET_DEMO, '--work-dir', work] + _opts(coco) + [f"load_from={files['lfs']}"], capsys,
                   [files['lfs']], work)
    assert err.startswith(f"load_from checkpoint: checkpoint file '{files['lfs']}' is not a PyTorch checkpoint: a Git "
                          'LFS pointer')
    config = tmp_path / 'pretrained.py'
    config.write_text(f"_base_ = [{DET_DEMO!r}]\nmodel = dict(backbone=dict(init_cfg=dict(_delete_=True, "
                      f"type='Pretrained', checkpoint={files['empty']!r})))\n")
    err = _refused(TRAIN, [str(config), '--work-dir', work] + _opts(coco), capsys, [files['empty']], work)
    assert err.startswith(f"pretrained checkpoint (model.backbone.init_cfg): checkpoint file '{files['empty']}' is "
                          'empty (0 bytes)')
    # a truncated legacy pickle passes the first-bytes check and fails inside the Runner, still named
    err = _refused(TRAIN, [DET_DEMO, '--work-dir', work] + _opts(coco) + [f"load_from={files['legacy_truncated']}"],
                   capsys, [files['legacy_truncated']], work)
    assert err.startswith(f"checkpoint file '{files['legacy_truncated']}' is truncated or damaged")
    # --resume without a path: the work dir's last checkpoint, cut short (the Runner reads it)
    resume_dir = tmp_path / 'resume_work'
    resume_dir.mkdir()
    (resume_dir / 'epoch_1.pth').write_bytes(open(files['truncated'], 'rb').read())
    (resume_dir / 'last_checkpoint').write_text(str(resume_dir / 'epoch_1.pth'))
    err = _refused(TRAIN, [DET_DEMO, '--work-dir', str(resume_dir), '--resume'] + _opts(coco), capsys,
                   [str(resume_dir / 'epoch_1.pth')])
    # (the only checkpoint there: no readable one to fall back to; the message names it and why)
    assert err.startswith(f'--resume: no readable checkpoint in {resume_dir}')
    assert f"'{resume_dir / 'epoch_1.pth'}' is a truncated or damaged zip archive" in err
    err = _refused(TRAIN, [DET_DEMO, '--work-dir', work] + _opts(coco) + ['load_from=http://127.0.0.1:9/w.pth'],
                   capsys, [], work)
    assert err.startswith("downloading checkpoint 'http://127.0.0.1:9/w.pth' failed (URLError: ")


# ------------------------------------------------------------------------------------------------
# misspelled config entries

def test_misspelled_type_and_argument_name_the_close_matches(coco, tmp_path, capsys):
    work = str(tmp_path / 'work')
    err = _refused(TRAIN, [DET_DEMO, '--work-dir', work] + _opts(coco) + ['model.backbone.type=PolaPVTT'], capsys,
                   [], work)
    assert err.startswith("model.backbone.type='PolaPVTT': no model of that name is registered (scope 'mmdet'); "
                          "did you mean 'PolaPVT'")
    err = _refused(TRAIN, [DET_DEMO, '--work-dir', work] + _opts(coco) + ['model.backbone.drop_path_rat=0.1'],
                   capsys, [], work)
    assert err == "model.backbone.drop_path_rat: PolaPVT has no argument 'drop_path_rat'; " \
                  "did you mean 'drop_path_rate' or 'drop_rate'?"
    # built later (the datasets, in runner.train()): the same line, without the config path
    err = _refused(TRAIN, [DET_DEMO, '--work-dir', work] + _opts(coco) + ['train_dataloader.dataset.type=CocoDatset'],
                   capsys, [], work)
    assert err.startswith("type='CocoDatset': no dataset of that name is registered (scope 'mmdet')")
    assert "did you mean 'CocoDataset'" in err
