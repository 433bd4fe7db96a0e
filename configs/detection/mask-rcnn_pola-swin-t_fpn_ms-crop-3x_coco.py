# Mask R-CNN + FPN with Pola-Swin-T on COCO 2017, 3x schedule (36 epochs, steps at 27 and 33) with
# multi-scale training and random crops, 8 GPUs x 2 images: the Swin recipe
# (Swin-Transformer-Object-Detection configs/swin/mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_adamw_3x_coco.py),
# as ported by mmdet (mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco) with Swin's 500 warm-up iterations
# (mmdet's port has 1000). Every number and its source: docs/recipes.md.
#
# Backbone weights: checkpoints/pola_swin_tiny.pth (see mask-rcnn_pola-swin-t_fpn_ms-crop-1x_coco.py).
_base_ = ['./_base_/mask-rcnn_fpn_ms-crop-3x.py', '../_base_/models/pola_swin_tiny.py']

# the shared Pola-Swin-T backbone moves into the model (pop: the dumped config holds it once)
model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.2),
    neck=dict(in_channels=_base_.pop('backbone_out_channels')))
