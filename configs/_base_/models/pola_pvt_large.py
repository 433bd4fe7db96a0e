# Pola-PVT-L backbone (ImageNet-1k pretrained at 224x224), shared by every task config.
#
# Inherit it next to an mmdet / mmseg base and move the backbone into the model:
#
#   _base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
#             '../_base_/models/pola_pvt_large.py']
#   model = dict(backbone=dict(_base_.pop('backbone'), _delete_=True),
#                neck=dict(in_channels=_base_.pop('backbone_out_channels')))
#
# `_base_.pop(...)` reads the variable and removes it, so the dumped config holds the backbone once,
# inside `model` (a second base may define `model` without a duplicate-key error). The drop path
# rate here is a default: every shipped task config sets its recipe's own (docs/recipes.md).
# Put the ImageNet checkpoint at checkpoints/pola_pvt_large.pth (official PolaFormer file or our own
# classification run; both load as is), or train from scratch with model.backbone.init_cfg=None.
_base_ = ['./pola_common.py']

backbone = dict(
    type='PolaPVT',
    arch='large',
    pretrain_img_size=224,
    out_indices=(0, 1, 2, 3),
    drop_path_rate=0.3,
    frozen_stages=-1,
    with_cp=False,
    init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvt_large.pth'))
backbone_out_channels = [64, 128, 320, 512]
