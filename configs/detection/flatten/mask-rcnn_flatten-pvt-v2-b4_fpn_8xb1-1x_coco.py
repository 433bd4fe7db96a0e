# Mask R-CNN + FPN with FLatten-PVTv2-B4 on COCO 2017, 1x schedule (12 epochs), 8 GPUs x 1 image:
# ./mask-rcnn_flatten-pvt-v2-b2_fpn_1x_coco.py with the B4 backbone, as PVTv2's own recipe (whai362/PVT
# detection/configs/mask_rcnn_pvt_v2_b4_fpn_1x_coco.py, lr 2e-4 / 1.4 with one image per GPU), drop path 0.1 as
# PVTv2's detection backbones (detection/pvt_v2.py). Every number and its source: docs/recipes.md. Backbone weights:
# the FLatten release publishes no B4 ImageNet weights; train them with configs/classification/flatten/ and put the
# checkpoint at checkpoints/flatten_pvt_v2_b4.pth, or train from scratch with --cfg-options
# model.backbone.init_cfg=None.
_base_ = ['./mask-rcnn_flatten-pvt-v2-b2_fpn_1x_coco.py']

model = dict(
    backbone=dict(arch='b4', drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/flatten_pvt_v2_b4.pth')))

# PVTv2-B4's recipe: one image per GPU, lr 2e-4 / 1.4
optim_wrapper = dict(optimizer=dict(lr=2e-4 / 1.4))
train_dataloader = dict(batch_size=1)
auto_scale_lr = dict(base_batch_size=8)
