# Importing this package registers the backbones in mmengine's root MODELS registry,
# which makes them visible to mmdet, mmseg and mmpretrain alike.
