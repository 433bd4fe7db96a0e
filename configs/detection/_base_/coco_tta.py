# Test-time augmentation and COCO evaluation shared by every detection config.
#
#   tools/test.py CONFIG CHECKPOINT --tta
#
# wraps the detector in `tta_model` and tests with `tta_pipeline`: every view's boxes are mapped
# back to the image, pooled and reduced with NMS (IoU 0.5, at most 100 per image); each kept
# Mask R-CNN detection keeps its own view's mask (PolaDetTTAModel, mmdet's DetTTAModel plus
# masks). 1x configs: horizontal flip at the test scale 1333x800. 3x (multi-scale trained)
# configs: `tta_pipeline = _base_.tta_ms_pipeline`, the flips at mmdet's three TTA scales.


def _tta_pipeline(scales):
    return [
        dict(type='LoadImageFromFile', backend_args=None),
        dict(
            type='TestTimeAug',
            transforms=[
                [dict(type='Resize', scale=scale, keep_ratio=True) for scale in scales],
                [dict(type='RandomFlip', prob=1.), dict(type='RandomFlip', prob=0.)],
                [dict(type='LoadAnnotations', with_bbox=True)],
                [dict(type='PackDetInputs',
                      meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor', 'flip',
                                 'flip_direction'))],
            ]),
    ]


tta_model = dict(type='PolaDetTTAModel', tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5), max_per_img=100))
tta_pipeline = _tta_pipeline([(1333, 800)])
tta_ms_pipeline = _tta_pipeline([(1333, 800), (666, 400), (2000, 1200)])
