# InLine-CSWin-T (20.6 M parameters): official ImageNet top-1 83.2. ImageNet-1k from scratch with the official
# recipe of LeapLabTHU/InLine (cfgs/inline_cswin_t.yaml on config.py, trained by main_ema.py --amp), 8 GPUs x
# 128 images (lr 5e-4 x 1024 / 512): the CSWin schedule of ../_base_/schedules/cswin_310e.py, weight decay
# 0.05, drop path 0.2, CSWin with the injective linear attention in stages 1-2 (the released layout 'IISS')
# and an EMA of the weights (timm's ModelEma in the official run, decay 0.9996^(1024/4096): main_ema.py (EMA
# on by default, decay 0.9996 raised to the power total batch / 4096)); validation and checkpoints use the
# averaged weights. Every number and its source: docs/recipes.md.
#   tools/dist_train.sh configs/classification/inline/inline-cswin-t_8xb128_in1k.py 8 --amp   (official: fp16)
#   tools/test.py configs/classification/inline/inline-cswin-t_8xb128_in1k.py CHECKPOINT
# (official InLine-CSWin files load as they are: their EMA weights when they hold them). The checkpoint
# feeds the dense configs' backbone (type='InLineCSWin', arch='tiny').
_base_ = [
    '../_base_/datasets/imagenet_timm.py',
    '../_base_/schedules/cswin_310e.py',
    '../_base_/default_runtime.py',
]

model = dict(
    type='ClassificationModel',
    family='cswin',
    arch='tiny',
    kind='inline',
    num_classes=1000,
    drop_path_rate=0.2,
    label_smoothing=0.1)

train_dataloader = dict(batch_size=128)
# the official EMA (validation and checkpoints use the averaged weights); buffers averaged, as ModelEma does
custom_hooks = [dict(type='SwitchableEMAHook', enabled=True, momentum=1 - 0.9996 ** (1024 / 4096),
                     update_buffers=True, priority='ABOVE_NORMAL')]
