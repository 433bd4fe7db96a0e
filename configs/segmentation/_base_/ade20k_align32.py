# ADE20K (./ade20k.py) tested as PVT's Semantic FPN and PolaFormer++'s segmentation configs test: the whole
# image resized to short side 512, then both sides resized to a multiple of 32 (PVT's AlignResize,
# PolaFormer++'s ResizeToMultiple; mmseg's ResizeToMultiple here). Predictions are resized back to the
# original image.
_base_ = ['./ade20k.py']

test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='CheckImage'),  # 3 channels, 0..255 (./ade20k.py)
    dict(type='Resize', scale=(2048, 512), keep_ratio=True),
    dict(type='ResizeToMultiple', size_divisor=32),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
