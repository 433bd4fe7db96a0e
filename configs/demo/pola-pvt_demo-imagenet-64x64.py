# The classification demo: a reduced Pola-PVT (Pola-PVT-T at half width, one block per stage, MLP
# ratio 4: 1.5 M parameters) trained from scratch on the synthetic ImageNet-layout dataset
# data/demo_imagenet (tools/make_demo_imagenet.py: 6 shape classes with overlapping hue ranges,
# 64x64, 300 train / 96 val images), sized to learn visibly in a few CPU minutes
# (tools/demo_classification.py). The same pipeline, model class, metric and tools as
# configs/classification/pola-pvt-t_8xb128_in1k.py, with what tiny data and a CPU need changed:
#   * light augmentation: random resized crop (scale 0.6-1), flip, colour jitter; no RandAugment,
#     random erasing or Mixup/CutMix (they slow convergence far beyond a few hundred steps);
#   * eval: resize to 64x64 (the images' size), no crop;
#   * batch 16, AdamW lr 2e-3 (not batch-scaled), 1 warm-up epoch, cosine to 0, 12 epochs of
#     18 steps.
# Swap in the real Pola-PVT-T with --cfg-options model.arch=tiny (about 6x slower here).
_base_ = ['../classification/pola-pvt-t_8xb128_in1k.py']

data_root = 'data/demo_imagenet/'
data_hint = 'generate the demo dataset with: python tools/make_demo_imagenet.py'
classes = ('circle', 'ring', 'square', 'triangle', 'cross', 'stripes')
img_size = 64
max_epochs = 12

model = dict(
    arch=dict(_delete_=True, embed_dims=[32, 64, 160, 256], num_heads=[1, 2, 5, 8],
              mlp_ratios=[4, 4, 4, 4], depths=[1, 1, 1, 1]),
    pretrain_img_size=img_size,
    num_classes=len(classes),
    drop_path_rate=0.0)

data_preprocessor = dict(random_erasing=None, mixup=None)

train_pipeline = [
    dict(type='LoadPILImage'),
    dict(type='TimmTransform', input_size=img_size, is_training=True, scale=(0.6, 1.0),
         color_jitter=0.4, interpolation='bicubic'),
    dict(type='PackClsInputs'),
]
test_pipeline = [
    dict(type='LoadPILImage'),
    dict(type='TimmTransform', input_size=img_size, is_training=False, crop_pct=1.0,
         crop_mode='squash', interpolation='bicubic'),
    dict(type='PackClsInputs'),
]
train_dataloader = dict(
    batch_size=16,
    num_workers=1,
    pin_memory=False,
    dataset=dict(data_root=data_root, metainfo=dict(classes=classes), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=32,
    num_workers=1,
    pin_memory=False,
    dataset=dict(data_root=data_root, metainfo=dict(classes=classes), pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(topk=(1, 3))
test_evaluator = val_evaluator

optim_wrapper = dict(optimizer=dict(lr=2e-3))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=True, begin=0, end=1, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', T_max=max_epochs - 1, eta_min=0.0, eta_min_ratio=None, by_epoch=True,
         begin=1, end=max_epochs, convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
auto_scale_lr = dict(enable=False, base_batch_size=16)  # the lr is for this batch; no scaling
default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(interval=max_epochs, max_keep_ckpts=1, save_best=None))
env_cfg = dict(cudnn_benchmark=False)
randomness = dict(seed=0, diff_rank_seed=False)
