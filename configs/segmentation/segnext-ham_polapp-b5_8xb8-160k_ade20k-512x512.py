# LightHamHead + PolaFormer++-B5 on ADE20K, 512x512 crops, 160k iterations, 8 GPUs x 8 images: the B2 recipe (official
# downstream/segmentation/configs/PolaPP/polapp_b2.py) with the B5 backbone. The PolaFormer++ release has no B5
# segmentation config; drop path 0.55 as the official B5 detection config. Every number and its source:
# docs/recipes.md. ImageNet-1k weights at checkpoints/polapp_b5.pth.
_base_ = ['./segnext-ham_polapp-b2_8xb8-160k_ade20k-512x512.py']

model = dict(
    backbone=dict(arch='b5', drop_path_rate=0.55,
                  init_cfg=dict(type='Pretrained', checkpoint='checkpoints/polapp_b5.pth', use_ema=False)),
    decode_head=dict(in_channels=[192, 448, 640]))  # B5's widths of stages 2-4
