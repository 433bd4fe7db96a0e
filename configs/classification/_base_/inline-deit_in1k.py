# What every InLine-DeiT ImageNet config shares (inline/inline-deit-*.py): the official recipe of
# LeapLabTHU/InLine (config.py defaults: the Swin schedule of schedules/pola-swin_300e.py), drop path 0.1,
# label smoothing 0.1, no weight decay on 1-D parameters, pos_embed and cls_token (the model's
# no_weight_decay). A config sets the size (model.arch) and the batch. Every number and its source:
# docs/recipes.md.
_base_ = [
    './datasets/imagenet_timm.py',
    './schedules/pola-swin_300e.py',
    './default_runtime.py',
]

model = dict(
    type='ClassificationModel',
    family='vit',
    arch='tiny',
    kind='inline',
    num_classes=1000,
    drop_path_rate=0.1,
    label_smoothing=0.1)

optim_wrapper = dict(paramwise_cfg=dict(
    _delete_=True,
    flat_decay_mult=0.0,
    custom_keys={'pos_embed': dict(decay_mult=0.0), 'cls_token': dict(decay_mult=0.0)}))
