# RetinaNet + FPN with Pola-PVT-T on COCO 2017, 1x schedule (12 epochs), 8 GPUs x 2 images.
#
# Everything but the backbone and the no-decay keys is mmdet's PVT-T RetinaNet recipe
# (retinanet_pvt-t_fpn_1x_coco: AdamW lr 1e-4, weight decay 1e-4, 500 warm-up iterations,
# steps at epochs 8 and 11; FPN from stage 2 on plus two extra levels, 1333x800 + flip).
#
# Backbone weights: checkpoints/pola_pvt_tiny.pth (see mask-rcnn_pola-pvt-t_fpn_1x_coco.py).
# Without it: --cfg-options model.backbone.init_cfg=None.
_base_ = ['mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py']
custom_imports = dict(imports=['mmpola'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='PolaPVT',
        arch='tiny',
        pretrain_img_size=224,
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.1,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvt_tiny.pth')),
    neck=dict(in_channels=[64, 128, 320, 512]))

# No weight decay on norms, position parameters and Pola's `attn.power` / `attn.scale` logits.
optim_wrapper = dict(
    paramwise_cfg=dict(
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
