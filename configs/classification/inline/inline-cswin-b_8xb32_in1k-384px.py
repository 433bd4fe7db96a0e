# InLine-CSWin-B at 384x384: fine-tuning of the 224 model with the official recipe of LeapLabTHU/InLine
# (cfgs/inline_cswin_b_384.yaml on config.py, main_ema.py --pretrained <224 checkpoint>), 8 GPUs x 32 images:
# 20 epochs of cosine from lr 5e-6 to 5e-7 (per 512 images) without warm-up, then 10 cool-down epochs at the
# minimum, weight decay 1e-8, no gradient clipping, drop path 0.7, the EMA on (decay 0.9996^(256/4096)); the
# linear stages' windows and the stripes follow the size (la_split_size 96-48-24-12, split_size 12 in stages
# 3-4: arch 'base_384'); eval: resize to 438 and centre crop 384 (TEST.CROP stays True). The InLine release
# publishes no 384 weights. Every number and its source: docs/recipes.md.
#   tools/dist_train.sh configs/classification/inline/inline-cswin-b_8xb32_in1k-384px.py 8
# Starts from the 224 weights at checkpoints/inline_cswin_base.pth (../inline-cswin-b_8xb64_in1k.py's
# run or the official file).
_base_ = ['./inline-cswin-b_8xb64_in1k.py']

img_size = 384
model = dict(arch='base_384', pretrain_img_size=img_size, drop_path_rate=0.7,
             init_cfg=dict(type='Pretrained', checkpoint='checkpoints/inline_cswin_base.pth'))

train_pipeline = [
    dict(type='LoadPILImage'),
    dict(type='TimmTransform', input_size=img_size, is_training=True, color_jitter=0.4,
         auto_augment='rand-m9-mstd0.5-inc1', interpolation='bicubic'),
    dict(type='PackClsInputs'),
]
test_pipeline = [
    dict(type='LoadPILImage'),
    dict(type='TimmTransform', input_size=img_size, is_training=False, crop_pct=224 / 256, crop_mode='squash',
         interpolation='bicubic'),
    dict(type='PackClsInputs'),
]
train_dataloader = dict(batch_size=32, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

base_lr = 5e-6
cosine_epochs = 20
max_epochs = 30
optim_wrapper = dict(optimizer=dict(lr=base_lr, weight_decay=1e-8))
param_scheduler = [
    dict(type='CosineAnnealingLR', T_max=cosine_epochs, eta_min_ratio=5e-7 / base_lr, by_epoch=True, begin=0,
         end=cosine_epochs, convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=max_epochs)
custom_hooks = [dict(type='SwitchableEMAHook', enabled=True, momentum=1 - 0.9996 ** (256 / 4096), update_buffers=True,
                     priority='ABOVE_NORMAL')]
