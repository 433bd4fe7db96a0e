# Pola-Swin-S backbone (ImageNet-1k pretrained at 224x224), shared by every task config.
#
# Inherit it next to an mmdet / mmseg base and swap the backbone in:
#
#   _base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
#             '../_base_/models/pola_swin_small.py']
#   model = dict(backbone=dict(_delete_=True, **_base_.backbone),
#                neck=dict(in_channels=_base_.backbone_out_channels))
#
# (`_base_.backbone` is read directly in the config, so a second base may define `model`
# without a duplicate-key error.) Put the ImageNet checkpoint at checkpoints/pola_swin_small.pth
# (official PolaFormer file or our own classification run; both load as is), or train from
# scratch with model.backbone.init_cfg=None.
custom_imports = dict(imports=['mmpola'], allow_failed_imports=False)

backbone = dict(
    type='PolaSwin',
    arch='small',
    pretrain_img_size=224,
    out_indices=(0, 1, 2, 3),
    drop_path_rate=0.3,
    frozen_stages=-1,
    with_cp=False,
    init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_swin_small.pth'))
backbone_out_channels = [96, 192, 384, 768]

# No weight decay for norms, position parameters, the softmax stages' relative position bias
# and Pola's exponent / temperature logits (mmengine matches these as substrings of parameter
# names): optim_wrapper = dict(paramwise_cfg=dict(custom_keys=_base_.backbone_no_decay_keys)).
backbone_no_decay_keys = {
    'norm': dict(decay_mult=0.),
    'pos_embed': dict(decay_mult=0.),
    'positional_encoding': dict(decay_mult=0.),
    'relative_position_bias_table': dict(decay_mult=0.),
    'attn.power': dict(decay_mult=0.),
    'attn.scale': dict(decay_mult=0.),
}
