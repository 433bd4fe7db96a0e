# FLatten-CSWin-T (21.2 M parameters): official ImageNet top-1 83.1. ImageNet-1k from scratch with the
# official recipe of LeapLabTHU/FLatten-Transformer (cfgs/flatten_cswin_t.yaml on config.py, trained by
# main_ema.py), 8 GPUs x 256 images (lr 5e-4 x 2048 / 512): the CSWin schedule of
# ../_base_/schedules/cswin_310e.py, weight decay 0.05, drop path 0.2, CSWin with the focused linear attention
# in stages 1-2 (the released layout 'LLSS') and an EMA of the weights (timm's ModelEma in the official run,
# decay 0.99984: its README (--model-ema --model-ema-decay 0.99984 for T and S, 0.99982 for B)); validation
# and checkpoints use the averaged weights. Every number and its source: docs/recipes.md.
#   tools/dist_train.sh configs/classification/flatten/flatten-cswin-t_8xb256_in1k.py 8
#   tools/test.py configs/classification/flatten/flatten-cswin-t_8xb256_in1k.py CHECKPOINT
# (official FLatten-CSWin files load as they are: their EMA weights when they hold them). The checkpoint
# feeds the dense configs' backbone (type='FLattenCSWin', arch='tiny').
_base_ = [
    '../_base_/datasets/imagenet_timm.py',
    '../_base_/schedules/cswin_310e.py',
    '../_base_/default_runtime.py',
]

model = dict(
    type='ClassificationModel',
    family='cswin',
    arch='tiny',
    kind='flatten',
    num_classes=1000,
    drop_path_rate=0.2,
    label_smoothing=0.1)

train_dataloader = dict(batch_size=256)
# the official EMA (validation and checkpoints use the averaged weights); buffers averaged, as ModelEma does
custom_hooks = [dict(type='SwitchableEMAHook', enabled=True, momentum=1 - 0.99984, update_buffers=True,
                     priority='ABOVE_NORMAL')]
