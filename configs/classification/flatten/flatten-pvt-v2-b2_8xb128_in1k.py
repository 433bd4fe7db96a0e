# FLatten-PVTv2-B2 (22.6 M parameters): the FLatten release publishes its recipe, no weights.
# ImageNet-1k from scratch with the official recipe of LeapLabTHU/FLatten-Transformer (cfgs/flatten_pvt_v2_b2.yaml
# on config.py, main.py), 8 GPUs x 128 images (lr 5e-4 x 1024 / 512): the PVT schedule of
# ../pola-pvt-t_8xb128_in1k.py (AdamW, weight decay 0.05, 5 warm-up epochs, cosine to epoch 300, 10 cool-down
# epochs, no gradient clipping) with PVTv2 and the focused linear attention
# (the released layout 'LLLL', la_sr_ratios '1111'). Every number and its source: docs/recipes.md.
#   tools/dist_train.sh configs/classification/flatten/flatten-pvt-v2-b2_8xb128_in1k.py 8
#   tools/test.py configs/classification/flatten/flatten-pvt-v2-b2_8xb128_in1k.py CHECKPOINT
# (official FLatten-PVTv2 files load as they are). The checkpoint feeds the dense configs' backbone
# (type='FLattenPVTv2', arch='b2'): init_cfg=dict(type='Pretrained', checkpoint=...).
_base_ = ['../pola-pvt-t_8xb128_in1k.py']

model = dict(family='pvt_v2', arch='b2', kind='flatten', drop_path_rate=0.1)
