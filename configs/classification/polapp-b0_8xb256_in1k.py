# PolaFormer++-B0 (4.7 M backbone parameters): official ImageNet top-1 76.9.
# ImageNet-1k from scratch, 8 GPUs x 256 images, official recipe (polaformer++/cfgs/pola_b0.yaml on the
# config.py defaults, trained by main_ema.py with an EMA of decay 0.99982 whose weights are the released
# ones). Train / test:
#   tools/dist_train.sh configs/classification/polapp-b0_8xb256_in1k.py 8 [--amp]
#   tools/test.py configs/classification/polapp-b0_8xb256_in1k.py CHECKPOINT   (official PolaFormer++ files load as is)
# The checkpoint (EMA weights) feeds the dense configs' PolaPP backbone: init_cfg=dict(type='Pretrained', ...).
_base_ = [
    './_base_/datasets/imagenet_timm.py',
    './_base_/schedules/polapp_300e.py',
    './_base_/default_runtime.py',
]

model = dict(
    type='ClassificationModel',
    family='polapp',
    arch='b0',
    num_classes=1000,
    drop_path_rate=0.1,
    label_smoothing=0.1)

train_dataloader = dict(batch_size=256)
# EMA on, as the official run (timm's ModelEma, --model-ema-decay 0.99982): validation and checkpoints use the
# averaged weights; buffers (BatchNorm statistics) are averaged too, as ModelEma averages the whole state dict
custom_hooks = [dict(type='SwitchableEMAHook', enabled=True, momentum=1.8e-4, update_buffers=True,
                     priority='ABOVE_NORMAL')]
