# Mask R-CNN + FPN with Pola-PVT-L on COCO 2017, 1x schedule, 8 GPUs x 1 image: PVT's large recipe
# (detection/configs/mask_rcnn_pvt_l_fpn_1x_coco.py: one image per GPU, lr 2e-4 / 1.4), the large
# backbone (depths 3-8-27-3) and no drop path (PVT's pvt_large detection backbone sets none).
# Backbone weights: checkpoints/pola_pvt_large.pth (see the Pola-PVT-T config).
_base_ = ['./mask-rcnn_pola-pvt-t_fpn_1x_coco.py']

model = dict(
    backbone=dict(
        arch='large',
        drop_path_rate=0.0,
        init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvt_large.pth')))

optim_wrapper = dict(optimizer=dict(lr=2e-4 / 1.4))
train_dataloader = dict(batch_size=1)
auto_scale_lr = dict(base_batch_size=8)
