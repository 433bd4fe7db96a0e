# ADE20K (150 classes, 512x512 crops) as mmseg's _base_/datasets/ade20k.py, plus three steps of
# mmpola.datasets: LoadCheckedImage loads the training images (mmcv's LoadImageFromFile that refuses a JPEG
# whose body is damaged, naming it, instead of training on the gray or noise it decodes to), CheckSegLabels in
# the training pipeline (a label map with a label the heads
# have no class for fails there, naming the file, instead of in the loss) and CheckImage right after
# loading in the test pipeline (test images in the form the model takes: 3 channels, 0..255; also the
# arrays given to MMSegInferencer). Shared by every ADE20K config.
_base_ = ['mmseg::_base_/datasets/ade20k.py']

train_pipeline = [
    dict(type='LoadCheckedImage'),  # a JPEG with a damaged body fails here, naming the file
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='CheckSegLabels', num_classes=150),
    dict(type='RandomResize', scale=(2048, 512), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=(512, 512), cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
test_pipeline = [_base_.test_pipeline[0], dict(type='CheckImage'), *_base_.test_pipeline[1:]]
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
