# Test-time augmentation shared by every detection config.
#
#   tools/test.py CONFIG CHECKPOINT --tta
#
# wraps the detector in `tta_model` and tests with `tta_pipeline`: every view's boxes are mapped
# back to the image, pooled and reduced with NMS (IoU 0.5, at most 100 per image); each kept
# Mask R-CNN detection keeps its own view's mask (PolaDetTTAModel, mmdet's DetTTAModel plus
# masks). Here: horizontal flip at the test scale 1333x800 (the single-scale configs);
# coco_tta_ms.py: the flips at mmdet's three TTA scales (the multi-scale trained configs).
tta_model = dict(type='PolaDetTTAModel', tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5), max_per_img=100))
tta_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(
        type='TestTimeAug',
        transforms=[
            [dict(type='Resize', scale=(1333, 800), keep_ratio=True)],
            [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
            [dict(type='LoadAnnotations', with_bbox=True)],
            [dict(type='PackDetInputs',
                  meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor', 'flip',
                             'flip_direction'))],
        ]),
]
