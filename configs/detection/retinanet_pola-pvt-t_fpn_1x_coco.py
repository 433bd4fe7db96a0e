# RetinaNet + FPN with Pola-PVT-T on COCO 2017, 1x schedule (12 epochs), 8 GPUs x 2 images.
#
# Everything but the backbone and the no-decay keys is mmdet's PVT-T RetinaNet recipe
# (retinanet_pvt-t_fpn_1x_coco: AdamW lr 1e-4, weight decay 1e-4, 500 warm-up iterations,
# steps at epochs 8 and 11; FPN from stage 2 on plus two extra levels, 1333x800 + flip).
#
# Backbone weights: checkpoints/pola_pvt_tiny.pth (see mask-rcnn_pola-pvt-t_fpn_1x_coco.py).
# Without it: --cfg-options model.backbone.init_cfg=None.
_base_ = [
    'mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py',
    '../_base_/models/pola_pvt_tiny.py',
    './_base_/coco_tta.py',
    '../_base_/runtime.py',
]
# mmpola's atomic checkpoint saves (configs/_base_/runtime.py says why this is set here)
default_hooks = dict(checkpoint=dict(type='mmpola.SafeCheckpointHook'))

model = dict(
    backbone=dict(_delete_=True, **_base_.backbone),
    neck=dict(in_channels=_base_.backbone_out_channels))

# No weight decay on norms, position parameters and Pola's `attn.power` / `attn.scale` logits.
optim_wrapper = dict(paramwise_cfg=dict(custom_keys=_base_.backbone_no_decay_keys))

train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(enable=False, base_batch_size=16)

# mmdet's CocoMetric, also for annotation files without `info`; `--tta`: horizontal flip
# (_base_/coco_tta.py)
