# Mask R-CNN + FPN with FLatten-CSWin-B on COCO 2017, 1x schedule (12 epochs) with multi-scale training and
# random crops, 8 GPUs x 2 images: ./mask-rcnn_flatten-cswin-t_fpn_ms-crop-1x_coco.py (Swin's Mask R-CNN recipe;
# microsoft/CSWin-Transformer publishes no detection configs) with the CSWin-B backbone, drop path 0.3
# as Swin's detection Swin-B (its Cascade Mask R-CNN config). Every number and its source: docs/recipes.md.
#
# Backbone weights: the FLatten release publishes no CSWin-B ImageNet weights; train them with
# configs/classification/flatten/ and put the checkpoint at checkpoints/flatten_cswin_base.pth, or train
# from scratch with --cfg-options model.backbone.init_cfg=None.
_base_ = ['./mask-rcnn_flatten-cswin-t_fpn_ms-crop-1x_coco.py']

model = dict(
    backbone=dict(arch='base', drop_path_rate=0.3,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/flatten_cswin_base.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))  # CSWin-B's stage widths
