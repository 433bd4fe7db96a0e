# LightHamHead + PolaFormer++-B4 on ADE20K, 512x512 crops, 160k iterations, 8 GPUs x 8 images: the B2 recipe (official
# downstream/segmentation/configs/PolaPP/polapp_b2.py) with the B4 backbone. The PolaFormer++ release has no B4
# segmentation config; drop path 0.4 as the official B4 detection configs. Every number and its source:
# docs/recipes.md. ImageNet-1k weights at checkpoints/polapp_b4.pth.
_base_ = ['./segnext-ham_polapp-b2_8xb8-160k_ade20k-512x512.py']

model = dict(
    backbone=dict(arch='b4', drop_path_rate=0.4,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/polapp_b4.pth', use_ema=False)),
    decode_head=dict(in_channels=[192, 384, 512]))  # B4's widths of stages 2-4
