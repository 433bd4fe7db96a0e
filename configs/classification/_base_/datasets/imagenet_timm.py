# ImageNet-1k in the folder layout (data/imagenet/{train,val}/<class>/*.JPEG), augmented as the
# official PolaFormer training (Swin's timm recipe):
#   train: RandomResizedCrop 224 (bicubic), flip, RandAugment rand-m9-mstd0.5-inc1 (timm then
#          skips the colour jitter 0.4, in the official run too), random erasing 0.25 (pixel
#          mode), Mixup 0.8 / CutMix 1.0 (switch prob 0.5, per batch), label smoothing 0.1;
#   eval:  square resize to (256, 256) bicubic, centre crop 224, ImageNet mean/std.
# Per-image steps run in the data workers (uint8 output); normalisation, random erasing and
# Mixup/CutMix run batch-wise on the device (TimmClsDataPreprocessor), as timm's prefetcher does.


data_root = 'data/imagenet/'
data_hint = ('put ImageNet-1k in the folder layout data/imagenet/train/<class>/*.JPEG and '
             'data/imagenet/val/<class>/*.JPEG (or symlink data/imagenet to your copy)')
num_classes = 1000
img_size = 224

train_pipeline = [
    dict(type='LoadPILImage'),
    dict(type='TimmTransform', input_size=img_size, is_training=True, color_jitter=0.4,
         auto_augment='rand-m9-mstd0.5-inc1', interpolation='bicubic'),
    dict(type='PackClsInputs'),
]
test_pipeline = [
    dict(type='LoadPILImage'),
    dict(type='TimmTransform', input_size=img_size, is_training=False, crop_pct=224 / 256,
         crop_mode='squash', interpolation='bicubic'),
    dict(type='PackClsInputs'),
]

data_preprocessor = dict(
    type='TimmClsDataPreprocessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    random_erasing=dict(probability=0.25, mode='pixel', max_count=1),
    mixup=dict(mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5, mode='batch',
               label_smoothing=0.1, num_classes=num_classes))

train_dataloader = dict(
    batch_size=128,
    num_workers=8,
    pin_memory=True,
    persistent_workers=True,
    drop_last=True,  # Mixup needs even batches; the official loader drops the last one too
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='default_collate'),
    dataset=dict(type='ImageNetFolderDataset', data_root=data_root,
                 data_prefix=dict(img_path='train'), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=64,
    num_workers=8,
    pin_memory=True,
    persistent_workers=True,
    drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'),
    # classes numbered from the training split's folders: a split that lacks a class keeps the indices
    dataset=dict(type='ImageNetFolderDataset', data_root=data_root, data_prefix=dict(img_path='val'),
                 classes_from='train', pipeline=test_pipeline, test_mode=True))
test_dataloader = val_dataloader
val_evaluator = dict(type='TopKAccuracy', topk=(1, 5))
test_evaluator = val_evaluator
