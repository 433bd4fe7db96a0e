# ADE20K (150 classes, 512x512 crops) as mmseg's _base_/datasets/ade20k.py, plus CheckSegLabels
# (mmpola.datasets.transforms) in the training pipeline: a label map with a label the heads have no
# class for fails there, naming the file, instead of in the loss. Shared by every ADE20K config.
_base_ = ['mmseg::_base_/datasets/ade20k.py']

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='CheckSegLabels', num_classes=150),
    dict(type='RandomResize', scale=(2048, 512), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=(512, 512), cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
