# RetinaNet + FPN with FLatten-PVT-T on COCO 2017, 1x schedule: ../retinanet_pola-pvt-t_fpn_1x_coco.py with the
# focused linear attention of FLatten Transformer (ICCV 2023) in the backbone, everything else identical, so the two
# compare the attention alone. Backbone weights: the official FLatten-PVT-T ImageNet weights, downloaded
# from its release (mmpola/checkpoint/sources.py); offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH.
_base_ = ['../retinanet_pola-pvt-t_fpn_1x_coco.py']

model = dict(backbone=dict(
    type='FLattenPVT',
    init_cfg=dict(checkpoint='https://cloud.tsinghua.edu.cn/f/3ab1d773f19d45648690/?dl=1')))
