# Pola-Swin-B at 384x384: fine-tuning of the 224 model, 8 GPUs x 32 images, official recipe
# (ZacharyMeng/PolaFormer cfgs/pola_swin_b_384.yaml on the config.py defaults, launched as pretrain.sh
# with --pretrained <224 checkpoint>): 30 epochs, AdamW lr 2e-5 per 512 images (x 256 / 512), weight
# decay 1e-8, 5 warm-up epochs from 2e-8, cosine to 2e-7, gradient norm clipped at 5.0, drop path 0.5,
# window 96 for the linear blocks (softmax window 12); eval: square resize to 384x384, no crop. Every
# number and its source: docs/recipes.md.
#   tools/dist_train.sh configs/classification/pola-swin-b_8xb32_in1k-384px.py 8 [--amp]
#   tools/test.py configs/classification/pola-swin-b_8xb32_in1k-384px.py CHECKPOINT
# Starts from the 224 weights at checkpoints/pola_swin_base.pth (official file or ../pola-swin-b_8xb64_in1k.py's
# run): positional encodings and relative position bias tables are resized bicubically, as the
# official load_pretrained, the head is kept.
_base_ = ['./pola-swin-b_8xb64_in1k.py']

img_size = 384
model = dict(pretrain_img_size=img_size, window_size=96,
             init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_swin_base.pth'))

train_pipeline = [
    dict(type='LoadPILImage'),
    dict(type='TimmTransform', input_size=img_size, is_training=True, color_jitter=0.4,
         auto_augment='rand-m9-mstd0.5-inc1', interpolation='bicubic'),
    dict(type='PackClsInputs'),
]
test_pipeline = [
    dict(type='LoadPILImage'),
    dict(type='TimmTransform', input_size=img_size, is_training=False, crop_pct=1.0, crop_mode='squash',
         interpolation='bicubic'),
    dict(type='PackClsInputs'),
]
train_dataloader = dict(batch_size=32, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

base_lr = 2e-5
warmup_epochs = 5
max_epochs = 30
optim_wrapper = dict(optimizer=dict(lr=base_lr, weight_decay=1e-8))
param_scheduler = [
    dict(type='LinearLR', start_factor=2e-8 / base_lr, by_epoch=True, begin=0, end=warmup_epochs,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=max_epochs - warmup_epochs, eta_min_ratio=2e-7 / base_lr,
         by_epoch=True, begin=warmup_epochs, end=max_epochs, convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=max_epochs)
