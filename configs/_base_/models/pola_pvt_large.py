# Pola-PVT-L backbone (ImageNet-1k pretrained at 224x224), shared by every task config.
#
# Inherit it next to an mmdet / mmseg base and swap the backbone in:
#
#   _base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
#             '../_base_/models/pola_pvt_large.py']
#   model = dict(backbone=dict(_delete_=True, **_base_.backbone),
#                neck=dict(in_channels=_base_.backbone_out_channels))
#
# (`_base_.backbone` is read directly in the config, so a second base may define `model`
# without a duplicate-key error.) Put the ImageNet checkpoint at checkpoints/pola_pvt_large.pth
# (official PolaFormer file or our own classification run; both load as is), or train from
# scratch with model.backbone.init_cfg=None.
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
