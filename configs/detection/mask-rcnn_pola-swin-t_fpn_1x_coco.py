# Mask R-CNN + FPN with Pola-Swin-T on COCO 2017, 1x schedule (12 epochs), 8 GPUs x 2 images.
#
# Everything but the backbone and the no-decay keys is mmdet's Swin-T recipe
# (mask-rcnn_swin-t-p4-w7_fpn_1x_coco: AdamW lr 1e-4, weight decay 0.05, warm-up 1000
# iterations, steps at epochs 8 and 11, 1333x800 + flip).
#
# Backbone weights: the ImageNet-1k Pola-Swin-T checkpoint at checkpoints/pola_swin_tiny.pth
# (official PolaFormer release or our own classification run). Without it, train from random
# initialisation with --cfg-options model.backbone.init_cfg=None.
_base_ = ['mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py']
custom_imports = dict(imports=['mmpola'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaSwin',
        arch='tiny',
        pretrain_img_size=224,
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.2,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_swin_tiny.pth')),
    neck=dict(in_channels=[96, 192, 384, 768]))

# No weight decay on norms, position parameters, the relative position bias of the softmax
# stages and Pola's `attn.power` / `attn.scale` logits (substring match on parameter names).
optim_wrapper = dict(
    paramwise_cfg=dict(
        _delete_=True,
        custom_keys={
            'norm': dict(decay_mult=0.),
            'pos_embed': dict(decay_mult=0.),
            'positional_encoding': dict(decay_mult=0.),
            'relative_position_bias_table': dict(decay_mult=0.),
            'attn.power': dict(decay_mult=0.),
            'attn.scale': dict(decay_mult=0.),
        }))

train_dataloader = dict(batch_size=2)
auto_scale_lr = dict(enable=False, base_batch_size=16)
