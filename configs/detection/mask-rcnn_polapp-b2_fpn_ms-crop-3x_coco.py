# Mask R-CNN + FPN with PolaFormer++-B2 on COCO 2017, 3x multi-scale-crop schedule (36 epochs, steps at
# 27 and 33, 500 warm-up iterations), 8 GPUs x 2 images, as the official configs/PolaPP/maskrcnn_b2_3x.py:
# the Swin 3x pipeline (flip, then either a resize of the short side to 480..800 or a resize to 400..600, a
# 384x600 crop and a resize to 480..800), AdamW lr 1e-4, weight decay 0.05 without decay on norms,
# absolute position embeddings and relative position bias tables (fp16: tools/train.py --amp).
# The pipeline and optimizer are mmdet's Swin-T 3x config. Every number and its source: docs/recipes.md.
# Backbone weights: checkpoints/polapp_b2.pth.
_base_ = ['./_base_/mask-rcnn_fpn_ms-crop-3x.py', '../_base_/models/polapp_b2.py']

model = dict(
    backbone=dict(_base_.pop('backbone'), _delete_=True, drop_path_rate=0.1),
    neck=dict(in_channels=_base_.pop('backbone_out_channels')))
