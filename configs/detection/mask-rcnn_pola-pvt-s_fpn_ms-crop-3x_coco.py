# Mask R-CNN + FPN with Pola-PVT-S on COCO 2017, 3x multi-scale-crop schedule (36 epochs, steps
# at 27 and 33), 8 GPUs x 2 images.
#
# Data pipeline and schedule are mmdet's Swin 3x recipe (mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco);
# the optimizer follows mmdet's PVT recipe: AdamW lr 1e-4, weight decay 1e-4.
# Backbone weights: checkpoints/pola_pvt_small.pth (see mask-rcnn_pola-pvt-t_fpn_1x_coco.py).
_base_ = [
    'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py',
    '../_base_/models/pola_pvt_small.py',
    './_base_/coco_tta.py',
    '../_base_/runtime.py',
]
# mmpola's atomic checkpoint saves (configs/_base_/runtime.py says why this is set here)
default_hooks = dict(checkpoint=dict(type='mmpola.SafeCheckpointHook'))

model = dict(
    backbone=dict(_base_.backbone, _delete_=True, drop_path_rate=0.2),
    neck=dict(in_channels=_base_.backbone_out_channels))

optim_wrapper = dict(
    optimizer=dict(weight_decay=1e-4),
    paramwise_cfg=dict(_delete_=True, custom_keys=_base_.backbone_no_decay_keys))

train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(enable=False, base_batch_size=16)

# mmdet's CocoMetric, also for annotation files without `info`; `--tta`: flips at three scales
# (_base_/coco_tta.py)
tta_pipeline = _base_.tta_ms_pipeline
