# coco_tta.py with the flips at mmdet's three TTA scales (1333x800, 666x400, 2000x1200), for the
# configs trained at multiple scales:  tools/test.py CONFIG CHECKPOINT --tta
_base_ = ['./coco_tta.py']

tta_pipeline = _base_.tta_pipeline  # the same views, resized three ways
tta_pipeline[1].transforms[0] = [
    dict(type='Resize', scale=scale, keep_ratio=True) for scale in ((1333, 800), (666, 400), (2000, 1200))]
