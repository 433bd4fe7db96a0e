# Semantic FPN + Pola-PVT-S on ADE20K, 512x512 crops, 40k iterations, 8 GPUs x 4 images: the Pola-PVT-T
# recipe (PVT's segmentation/configs/sem_fpn/PVT/fpn_pvt_s_ade20k_40k.py) with the small backbone, drop path 0.1
# as PVT's segmentation backbones. ImageNet-1k weights at checkpoints/pola_pvt_small.pth.
_base_ = ['./fpn_pola-pvt-t_8xb4-40k_ade20k-512x512.py']

model = dict(
    backbone=dict(arch='small', drop_path_rate=0.1,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/pola_pvt_small.pth')))
