# UperNet + PolaFormer++-B2 on ADE20K, 512x512 crops, 160k iterations, 8 GPUs x 2 images: mmseg's Swin
# UperNet recipe (see _base_/upernet_8xb2-160k_ade20k-512x512.py) with the PolaPP-B2 backbone of
# configs/_base_/models/polapp_b2.py, ImageNet-1k weights at checkpoints/polapp_b2.pth (without them,
# train from scratch with --cfg-options model.backbone.init_cfg=None).
_base_ = ['./_base_/upernet_8xb2-160k_ade20k-512x512.py', '../_base_/models/polapp_b2.py']

model = dict(
    backbone=dict(_delete_=True, **_base_.backbone),
    decode_head=dict(in_channels=_base_.backbone_out_channels),
    auxiliary_head=dict(in_channels=_base_.backbone_out_channels[2]))
optim_wrapper = dict(paramwise_cfg=dict(custom_keys=_base_.backbone_no_decay_keys))
