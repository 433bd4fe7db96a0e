"""Helpers of the segmentation tests: config loading, model building, input batches."""
import copy
import os.path as osp

import torch

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def load_config(path):
    from mmengine.config import Config

    import mmpola  # noqa: F401
    from mmpola.engine import register_task_modules
    cfg = Config.fromfile(path)
    register_task_modules(cfg)
    return cfg


def build_segmentor(model_cfg):
    """Build as tools/train.py does on one CPU process (SyncBN -> BN), without ImageNet weights."""
    from mmseg.registry import MODELS

    from mmpola.engine import replace_sync_bn
    model_cfg = copy.deepcopy(model_cfg)
    model_cfg.backbone.init_cfg = None
    replace_sync_bn(model_cfg)
    model = MODELS.build(model_cfg)
    model.init_weights()
    return model


def seg_batch(shapes, num_classes, seed=0):
    """A data-preprocessor input: uint8 images of the given (H, W) with random label maps."""
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    generator = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    for height, width in shapes:
        inputs.append(torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=generator))
        sample = SegDataSample(metainfo=dict(img_shape=(height, width), ori_shape=(height, width),
                                             pad_shape=(height, width)))
        labels = torch.randint(0, num_classes, (1, height, width), generator=generator)
        labels[:, :2] = 255  # a few ignored pixels, as reduce_zero_label produces
        sample.gt_sem_seg = PixelData(data=labels)
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def check_trains_one_step_and_predicts(cfg, train_size, predict_size):
    """Build ``cfg``'s segmentor, one training step on two ``train_size`` crops with a gradient for
    every parameter, then a prediction at ``predict_size`` (its own size back). Shared by the
    config tests of the backbones."""
    from mmengine.optim import build_optim_wrapper
    torch.manual_seed(0)
    model = build_segmentor(cfg.model)
    num_classes = cfg.model.decode_head.num_classes
    model.data_preprocessor.size = train_size
    optim_wrapper = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
    model.train()
    batch = model.data_preprocessor(seg_batch([train_size, train_size], num_classes), True)
    loss, log_vars = model.parse_losses(model(**batch, mode='loss'))
    assert torch.isfinite(loss), log_vars
    optim_wrapper.backward(loss)
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not unused, unused
    optim_wrapper.step()
    model.eval()
    with torch.no_grad():
        batch = model.data_preprocessor(seg_batch([predict_size], num_classes), False)
        pred = model(**batch, mode='predict')[0].pred_sem_seg.data
    assert pred.shape == (1, *predict_size)
