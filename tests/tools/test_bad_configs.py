"""Bad configs give clear errors at build or first forward, for PolaPVT and PolaSwin, built
directly, through a full mmdet detector config, and through tools/train.py: an unknown arch,
out_indices out of range, frozen_stages beyond the depth, a pretrained checkpoint of the other
family (or a plain softmax PVT / Swin one) and an input smaller than the minimum size. Each
message names the bad value and what is valid."""
import copy
import os.path as osp

import mmdet  # noqa: E402,F401  (required: a broken install fails here)
import pytest
import torch

import mmpola  # noqa: E402,F401
from mmpola.checkpoint import CheckpointMismatchError  # noqa: E402
from mmpola.models import PolaPVT, PolaSwin  # noqa: E402
from tests.fixtures.paths import REPO  # noqa: E402
from tests.fixtures.tools import load_tool

DATA = osp.join(REPO, 'tests', 'data')
DET_CONFIG = {'pvt': osp.join(REPO, 'configs', 'detection', 'mask-rcnn_pola-pvt-t_fpn_1x_coco.py'),
              'swin': osp.join(REPO, 'configs', 'detection', 'mask-rcnn_pola-swin-t_fpn_ms-crop-1x_coco.py')}
DEMO_CONFIG = osp.join(REPO, 'configs', 'demo', 'mask-rcnn_pola-pvt-t_fpn_demo-coco.py')
CLS = {'pvt': PolaPVT, 'swin': PolaSwin}
OTHER = {'pvt': 'swin', 'swin': 'pvt'}
# the golden mini architectures (tests/data/pola_*_mini_official.pth)
MINI = {'pvt': dict(arch=dict(embed_dims=[16, 32, 80, 128], num_heads=[1, 2, 5, 8], mlp_ratios=[8, 8, 4, 4],
                              depths=[1, 1, 2, 1])),
        'swin': dict(arch=dict(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8]),
                     attn_type='LLSS')}
MINI_CHANNELS = {'pvt': [16, 32, 80, 128], 'swin': [16, 32, 64, 128]}


def _official(family):
    path = osp.join(DATA, f'pola_{family}_mini_official.pth')
    if not osp.isfile(path):
        pytest.fail(f'golden file {path} is missing (restore tests/data from the repository)')
    return path


# (backbone settings, what the message must say) per case; checkpoints and the input size are
# handled by the tests themselves
BUILD_CASES = {
    'unknown arch': (dict(arch='huge'),
                     {'pvt': r"unknown arch 'huge' for PolaPVT; valid: tiny, small, medium, large",
                      'swin': r"unknown arch 'huge' for PolaSwin; valid: tiny, small, base"}),
    'out_indices': (dict(out_indices=(0, 4)), r'out_indices \(0, 4\) out of range; valid stages are 0\.\.3'),
    'frozen_stages': (dict(frozen_stages=5),
                      r'frozen_stages=5 is beyond the depth.*'
                      r'use -1 \(nothing\), 0 \(patch embedding\) \.\. 4'),
}
SMALL_INPUT = r'input size 16x48 is smaller than the minimum 32x32'
FAMILY_NAME = {'pvt': r'Pola-PVT \(type="PolaPVT"\)', 'swin': r'Pola-Swin \(type="PolaSwin"\)'}


def _match(expected, family):
    return expected[family] if isinstance(expected, dict) else expected


# --------------------------------------------------------------------------------------------
# the backbones built directly

@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_other_family_checkpoint_fails_at_init_weights(family):
    """A Pola-PVT checkpoint for PolaSwin (and the reverse) through init_cfg: the error names the
    family the checkpoint belongs to."""
    model = CLS[family](**MINI[family], init_cfg=dict(type='Pretrained', checkpoint=_official(OTHER[family])))
    with pytest.raises(CheckpointMismatchError, match=FAMILY_NAME[OTHER[family]]):
        model.init_weights()


def _save_detector_checkpoint(state_dict, path):
    """What mmdet saves: the backbone under 'backbone.', next to neck / heads, mmengine meta."""
    sd = {f'backbone.{k}': v for k, v in state_dict.items()}
    sd['neck.lateral_convs.0.conv.weight'] = torch.zeros(4, 4, 1, 1)
    torch.save({'state_dict': sd, 'meta': {'epoch': 12}}, path)
    return str(path)


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_plain_softmax_checkpoints_are_refused(family, tmp_path):
    """A plain mmdet PVT / Swin checkpoint (different keys) and an official softmax PVT-v1 / Swin
    one (same key layout, no Pola attention weights) must not load silently into a Pola backbone:
    everything around the attention would load and the Pola attention would stay random."""
    from mmdet.models.backbones import PyramidVisionTransformer, SwinTransformer
    if family == 'pvt':
        mmdet_sd = PyramidVisionTransformer(embed_dims=16, num_layers=[1, 1, 1, 1],
                                            num_heads=[1, 2, 5, 8]).state_dict()
    else:
        mmdet_sd = SwinTransformer(embed_dims=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8]).state_dict()
    path = _save_detector_checkpoint(mmdet_sd, tmp_path / 'mmdet.pth')
    model = CLS[family](**MINI[family], init_cfg=dict(type='Pretrained', checkpoint=path))
    name = {'pvt': 'PVT', 'swin': 'Swin'}[family]
    with pytest.raises(CheckpointMismatchError,
                       match=rf'mmdet/mmseg {name} \(not Pola.*needs a PolaFormer checkpoint.*init_cfg=None'):
        model.init_weights()

    softmax_sd = CLS[family](**MINI[family] | dict(attn_type='SSSS')).state_dict()  # the official layout
    path = _save_detector_checkpoint(softmax_sd, tmp_path / 'softmax.pth')
    model = CLS[family](**MINI[family], init_cfg=dict(type='Pretrained', checkpoint=path))
    kind = {'pvt': r'a softmax PVT \(PVT-v1\) checkpoint', 'swin': 'a softmax Swin checkpoint'}[family]
    with pytest.raises(CheckpointMismatchError,
                       match=rf"none of the Pola attention weights of {type(model).__name__}.*{kind}.*"
                             r"attn_type='SSSS'"):
        model.init_weights()
    # the way out the message names: a softmax model takes it
    softmax = CLS[family](**MINI[family] | dict(attn_type='SSSS'),
                          init_cfg=dict(type='Pretrained', checkpoint=path))
    softmax.init_weights()
    for key, value in softmax.state_dict().items():
        if key in softmax_sd and not key.endswith(('attn_mask', 'relative_position_index')):
            assert torch.equal(value, softmax_sd[key]), key


# --------------------------------------------------------------------------------------------
# a full detector config (configs/detection), built with mmdet's registry

@pytest.fixture(scope='module')
def det_cfgs():
    from mmdet.utils import register_all_modules
    from mmengine.config import Config
    register_all_modules(init_default_scope=True)
    return {family: Config.fromfile(path) for family, path in DET_CONFIG.items()}


def _det_model_cfg(det_cfgs, family, **backbone):
    cfg = copy.deepcopy(det_cfgs[family].model)
    cfg.backbone.init_cfg = None
    cfg.backbone.update(backbone)
    return cfg


@pytest.mark.parametrize('family', ['pvt', 'swin'])
@pytest.mark.parametrize('case', sorted(BUILD_CASES))
def test_detector_config_build_errors(det_cfgs, family, case):
    from mmdet.registry import MODELS
    settings, expected = BUILD_CASES[case]
    with pytest.raises(ValueError, match=_match(expected, family)):
        MODELS.build(_det_model_cfg(det_cfgs, family, **settings))


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_detector_config_checkpoint_and_input_errors(det_cfgs, family):
    from mmdet.registry import MODELS
    cfg = _det_model_cfg(det_cfgs, family,
                         init_cfg=dict(type='Pretrained', checkpoint=_official(OTHER[family])))
    model = MODELS.build(cfg)
    with pytest.raises(CheckpointMismatchError, match=FAMILY_NAME[OTHER[family]]):
        model.init_weights()
    model.eval()
    with torch.no_grad(), pytest.raises(ValueError, match=SMALL_INPUT):
        model.extract_feat(torch.randn(1, 3, 16, 48))


# --------------------------------------------------------------------------------------------
# tools/train.py on a tiny detection config (demo Mask R-CNN, mini backbones, 4 generated images)

@pytest.fixture(scope='module')
def tiny_det(tmp_path_factory):
    """{'pvt' | 'swin': config path}: the demo detector with the golden mini backbone (initialised
    from its own family's golden checkpoint) on a tiny generated COCO set."""
    from mmpola.datasets import make_demo_coco
    root = tmp_path_factory.mktemp('tiny_coco')
    make_demo_coco(str(root), num_train=2, num_val=1, seed=1, image_shapes=((64, 64),), verbose=False)
    out = {}
    for family in ('pvt', 'swin'):
        backbone = dict(type=CLS[family].__name__, **MINI[family], drop_path_rate=0.0,
                        init_cfg=dict(type='Pretrained', checkpoint=_official(family)))
        config = root / f'tiny_{family}.py'
        config.write_text(f"""
_base_ = [{DEMO_CONFIG!r}]
data_root = {str(root) + '/'!r}
model = dict(backbone=dict(_delete_=True, **{backbone!r}), neck=dict(in_channels={MINI_CHANNELS[family]!r}))
train_dataloader = dict(batch_size=2, num_workers=0, persistent_workers=False,
                        dataset=dict(data_root=data_root))
val_dataloader = None
val_cfg = None
val_evaluator = None
test_dataloader = None
test_cfg = None
test_evaluator = None
train_cfg = dict(max_epochs=1)
""")
        out[family] = str(config)
    return out


def _train_error(argv, capsys):
    """The message tools/train.py ends with: a user error (exit status 2, one 'error: ...' line on
    stderr, no traceback)."""
    train = load_tool('train')
    with pytest.raises(SystemExit) as exc:
        train.main(argv)
    assert exc.value.code == 2, exc.value.code
    err = capsys.readouterr().err
    assert 'error: ' in err and 'Traceback' not in err, err[-2000:]
    return err


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_train_tool_reports_bad_configs(tiny_det, family, tmp_path, capsys):
    import re
    base = [tiny_det[family], '--work-dir', str(tmp_path)]
    option = {'unknown arch': 'model.backbone.arch=huge', 'out_indices': 'model.backbone.out_indices=(0,4)',
              'frozen_stages': 'model.backbone.frozen_stages=5'}
    for case, (_, expected) in BUILD_CASES.items():
        message = _train_error(base + ['--cfg-options', option[case]], capsys)
        assert re.search(_match(expected, family), message), (case, message)

    other = _official(OTHER[family])
    message = _train_error(base + ['--cfg-options', f'model.backbone.init_cfg.checkpoint={other}'], capsys)
    assert re.search(FAMILY_NAME[OTHER[family]], message), message

    # images resized to 16x48 and not padded: the backbone refuses the first batch
    message = _train_error(base + ['--cfg-options', 'train_dataloader.dataset.pipeline.2.scale=(48,16)',
                                   'train_dataloader.dataset.pipeline.2.keep_ratio=False',
                                   'model.data_preprocessor.pad_size_divisor=1'], capsys)
    assert re.search(SMALL_INPUT, message), message
