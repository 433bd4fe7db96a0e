# InLine-DeiT-S (16.7 M parameters, trained and evaluated at 288x288): official ImageNet top-1 80.2.
# ImageNet-1k from scratch with the official recipe of LeapLabTHU/InLine (cfgs/inline_deit_s.yaml on
# config.py, main.py --amp), 8 GPUs x 128 images (lr 5e-4 x 1024 / 512): the config.py defaults, which are the
# Swin schedule of ../_base_/schedules/pola-swin_300e.py (AdamW, weight decay 0.05, 20 warm-up epochs, cosine
# to epoch 300, gradient norm clipped at 5.0), drop path 0.1, no weight decay on 1-D parameters, pos_embed and
# cls_token (the model's no_weight_decay); the plain ViT with InLine attention in every block. Every number
# and its source: docs/recipes.md.
#   tools/dist_train.sh configs/classification/inline/inline-deit-s_8xb128_in1k-288px.py 8 --amp   (official: fp16)
#   tools/test.py configs/classification/inline/inline-deit-s_8xb128_in1k-288px.py CHECKPOINT
#   (official files load as they are)
_base_ = ['../_base_/inline-deit_in1k.py']

model = dict(arch='small')

img_size = 288
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
train_dataloader = dict(batch_size=128, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
