# Mask R-CNN + FPN with Pola-PVT-S on COCO 2017, 3x multi-scale-crop schedule (36 epochs, steps at 27
# and 33), 8 GPUs x 2 images: the PVT family's 3x recipe (whai362/PVT
# detection/configs/mask_rcnn_pvt_v2_b2_fpn_3x_mstrain.py: AdamW lr 1e-4, weight decay 0.05 without
# decay on norms, position embeddings and relative position bias, 500 warm-up iterations, the
# DETR-style multi-scale + crop pipeline), which is mmdet's Swin-T 3x config apart from the warm-up.
# Every number and its source: docs/recipes.md.
# Backbone weights: checkpoints/pola_pvt_small.pth (see mask-rcnn_pola-pvt-t_fpn_1x_coco.py).
_base_ = ['./_base_/mask-rcnn_fpn_ms-crop-3x.py', '../_base_/models/pola_pvt_small.py']

model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.1),
    neck=dict(in_channels=_base_.pop('backbone_out_channels')))
