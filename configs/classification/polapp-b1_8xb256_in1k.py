# PolaFormer++-B1 (6.4 M backbone parameters): official ImageNet top-1 79.1.
# ImageNet-1k from scratch, 8 GPUs x 256 images, official recipe (polaformer++/cfgs/pola_b1.yaml on the
# config.py defaults, trained by main_ema.py with an EMA of decay 0.99982 whose weights are the released
# ones). Train / test:
#   tools/dist_train.sh configs/classification/polapp-b1_8xb256_in1k.py 8 [--amp]
#   tools/test.py configs/classification/polapp-b1_8xb256_in1k.py CHECKPOINT   (official PolaFormer++ files load as is)
# The checkpoint (EMA weights) feeds the dense configs' PolaPP backbone: init_cfg=dict(type='Pretrained', ...).
_base_ = ['./polapp-b0_8xb256_in1k.py']  # the official recipe; this size's own settings below

model = dict(arch='b1', drop_path_rate=0.1)
