# Cascade Mask R-CNN + FPN with Pola-Swin-T on COCO 2017, 3x multi-scale-crop schedule (36 epochs,
# steps at 27 and 33), 8 GPUs x 2 images: the Swin recipe (Swin-Transformer-Object-Detection
# configs/swin/cascade_mask_rcnn_swin_tiny_patch4_window7_mstrain_480-800_giou_4conv1f_adamw_3x_coco.py
# with configs/_base_/models/cascade_mask_rcnn_swin_fpn.py). Every number and its source:
# docs/recipes.md.
#
# Data, schedule and optimizer: our Mask R-CNN Pola-Swin-T 3x config (the same in Swin's repository).
# Detector: Swin's Cascade Mask R-CNN - the RPN of mmdet's cascade base (smooth-L1 loss with beta 1/9,
# anchors inside the image only, 2000 training proposals), three stages (IoU 0.5/0.6/0.7, loss weights
# 1/0.5/0.25), each box head with 4 shared convs + 1 fc ("4conv1fc") and SyncBN, regressing decoded
# boxes with a GIoU loss (weight 10). The RoI extractors and the mask head are those of Mask R-CNN,
# one mask head per stage. tools/train.py turns SyncBN into BN for one process.
#
# Backbone weights: checkpoints/pola_swin_tiny.pth (see mask-rcnn_pola-swin-t_fpn_ms-crop-1x_coco.py).
_base_ = ['./mask-rcnn_pola-swin-t_fpn_ms-crop-3x_coco.py']


def _bbox_head(target_stds):  # the three stages differ only in their box coder
    return dict(
        type='Shared4Conv1FCBBoxHead',
        in_channels=256,
        conv_out_channels=256,
        fc_out_channels=1024,
        roi_feat_size=7,
        num_classes=80,
        bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0., 0., 0., 0.], target_stds=target_stds),
        reg_class_agnostic=False,
        reg_decoded_bbox=True,
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        loss_cls=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
        loss_bbox=dict(type='GIoULoss', loss_weight=10.0))


def _rcnn_stage(iou_thr):
    return dict(
        assigner=dict(type='MaxIoUAssigner', pos_iou_thr=iou_thr, neg_iou_thr=iou_thr, min_pos_iou=iou_thr,
                      match_low_quality=False, ignore_iof_thr=-1),
        sampler=dict(type='RandomSampler', num=512, pos_fraction=0.25, neg_pos_ub=-1, add_gt_as_proposals=True),
        mask_size=28,
        pos_weight=-1,
        debug=False)


model = dict(
    type='CascadeRCNN',
    rpn_head=dict(loss_bbox=dict(_delete_=True, type='SmoothL1Loss', beta=1.0 / 9.0, loss_weight=1.0)),
    roi_head=dict(
        type='CascadeRoIHead',
        num_stages=3,
        stage_loss_weights=[1, 0.5, 0.25],
        bbox_head=[
            _bbox_head([0.1, 0.1, 0.2, 0.2]),
            _bbox_head([0.05, 0.05, 0.1, 0.1]),
            _bbox_head([0.033, 0.033, 0.067, 0.067]),
        ]),
    train_cfg=dict(
        rpn=dict(allowed_border=0),
        rpn_proposal=dict(max_per_img=2000),
        rcnn=[_rcnn_stage(0.5), _rcnn_stage(0.6), _rcnn_stage(0.7)]))
