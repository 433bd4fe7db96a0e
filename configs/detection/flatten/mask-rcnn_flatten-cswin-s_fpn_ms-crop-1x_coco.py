# Mask R-CNN + FPN with FLatten-CSWin-S on COCO 2017, 1x schedule (12 epochs) with multi-scale training and
# random crops, 8 GPUs x 2 images: ./mask-rcnn_flatten-cswin-t_fpn_ms-crop-1x_coco.py (Swin's Mask R-CNN recipe;
# microsoft/CSWin-Transformer publishes no detection configs) with the CSWin-S backbone, drop path 0.2
# as Swin's detection Swin-S (its 3x configs). Every number and its source: docs/recipes.md.
#
# Backbone weights: the FLatten release publishes no CSWin-S ImageNet weights; train them with
# configs/classification/flatten/ and put the checkpoint at checkpoints/flatten_cswin_small.pth, or train
# from scratch with --cfg-options model.backbone.init_cfg=None.
_base_ = ['./mask-rcnn_flatten-cswin-t_fpn_ms-crop-1x_coco.py']

model = dict(
    backbone=dict(arch='small', drop_path_rate=0.2,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/flatten_cswin_small.pth')),
    neck=dict(in_channels=[64, 128, 256, 512]))  # CSWin-S's stage widths
