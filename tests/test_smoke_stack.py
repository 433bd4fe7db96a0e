"""The OpenMMLab stack works on this machine (CPU): compiled mmcv ops, an mmdet Mask R-CNN and an
mmseg UperNet train one step and predict, timm and torchvision import together."""
import copy
import importlib
import os.path as osp

import torch


def _package_config(package, relpath):
    """A config shipped inside an installed OpenMMLab package (what ``package::relpath`` names)."""
    root = osp.dirname(importlib.import_module(package).__file__)
    return osp.join(root, '.mim', 'configs', relpath)


def test_mmcv_compiled_ops_run_on_cpu():
    import mmcv
    from mmcv.ops import RoIAlign, nms
    from mmcv.utils import ext_loader
    ext_loader.load_ext('_ext', ['nms', 'roi_align_forward'])  # mmcv._ext was compiled
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.], [20., 20., 30., 30.]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    dets, keep = nms(boxes, scores, iou_threshold=0.5)
    assert keep.tolist() == [0, 2] and dets.shape == (2, 5)
    feats = torch.arange(16.).view(1, 1, 4, 4)
    rois = torch.tensor([[0., 0., 0., 3., 3.]])
    out = RoIAlign((2, 2), spatial_scale=1.0, sampling_ratio=2, aligned=True)(feats, rois)
    assert out.shape == (1, 1, 2, 2) and torch.isfinite(out).all()
    assert mmcv.__version__ == '2.1.0'


def test_timm_and_torchvision_import_together():
    import timm
    import torchvision
    from torchvision.ops import nms
    assert nms(torch.tensor([[0., 0., 1., 1.]]), torch.tensor([1.]), 0.5).tolist() == [0]
    model = timm.create_model('resnet18', pretrained=False, num_classes=3).eval()
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 3)
    assert torchvision.__version__


def _one_step_and_predict(model, data):
    model.train()
    optim = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = model.data_preprocessor(copy.deepcopy(data), True)
    losses = model(**batch, mode='loss')
    loss, _ = model.parse_losses(losses)
    assert torch.isfinite(loss)
    loss.backward()
    optim.step()
    model.eval()
    with torch.no_grad():
        batch = model.data_preprocessor(copy.deepcopy(data), False)
        return model(**batch, mode='predict')


def test_mmdet_mask_rcnn_trains_and_predicts():
    from mmdet.registry import MODELS
    from mmdet.testing import demo_mm_inputs
    from mmdet.utils import register_all_modules
    from mmengine.config import Config
    register_all_modules()
    cfg = Config.fromfile(_package_config('mmdet', 'mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'))
    model_cfg = cfg.model
    model_cfg.backbone.update(depth=18, init_cfg=None)
    model_cfg.neck.update(in_channels=[64, 128, 256, 512], out_channels=64)
    model_cfg.rpn_head.update(in_channels=64, feat_channels=64)
    model_cfg.roi_head.bbox_roi_extractor.out_channels = 64
    model_cfg.roi_head.bbox_head.update(in_channels=64, fc_out_channels=256, num_classes=3)
    model_cfg.roi_head.mask_roi_extractor.out_channels = 64
    model_cfg.roi_head.mask_head.update(in_channels=64, conv_out_channels=64, num_classes=3)
    model_cfg.train_cfg.rcnn.sampler.num = 128
    model = MODELS.build(model_cfg)
    data = demo_mm_inputs(2, [[3, 96, 128], [3, 128, 96]], num_items=[2, 1], num_classes=3,
                          with_mask=True)
    results = _one_step_and_predict(model, data)
    assert len(results) == 2
    assert hasattr(results[0].pred_instances, 'masks')


def test_mmseg_upernet_trains_and_predicts():
    from mmengine.config import Config
    from mmengine.structures import PixelData
    from mmseg.registry import MODELS
    from mmseg.structures import SegDataSample
    from mmseg.utils import register_all_modules
    register_all_modules()
    cfg = Config.fromfile(_package_config('mmseg', '_base_/models/upernet_r50.py'))
    norm_cfg = dict(type='BN', requires_grad=True)
    model_cfg = cfg.model
    model_cfg.pretrained = None
    model_cfg.backbone.update(depth=18, norm_cfg=norm_cfg)
    model_cfg.decode_head.update(in_channels=[64, 128, 256, 512], channels=32, num_classes=4,
                                 norm_cfg=norm_cfg)
    model_cfg.auxiliary_head.update(in_channels=256, channels=16, num_classes=4, norm_cfg=norm_cfg)
    model_cfg.data_preprocessor.size = (64, 64)
    model = MODELS.build(model_cfg)
    data = dict(inputs=[], data_samples=[])
    for _ in range(2):
        sample = SegDataSample(metainfo=dict(img_shape=(64, 64), ori_shape=(64, 64),
                                             pad_shape=(64, 64)))
        sample.gt_sem_seg = PixelData(data=torch.randint(0, 4, (1, 64, 64)))
        data['inputs'].append(torch.randint(0, 255, (3, 64, 64), dtype=torch.uint8))
        data['data_samples'].append(sample)
    results = _one_step_and_predict(model, data)
    assert results[0].pred_sem_seg.data.shape == (1, 64, 64)


def test_custom_imports_installs_the_checkpoint_allowlist():
    """What configs do (`custom_imports=['mmpola']`) is enough for mmengine to load checkpoints."""
    from mmengine.logging import HistoryBuffer
    from mmengine.utils import import_modules_from_strings
    import_modules_from_strings(imports=['mmpola'], allow_failed_imports=False)
    assert HistoryBuffer in torch.serialization.get_safe_globals()
