# PolaFormer++-B3 (24.0 M backbone parameters): official ImageNet top-1 84.3.
# ImageNet-1k from scratch, 8 GPUs x 128 images, official recipe (polaformer++/cfgs/pola_b3.yaml on the
# config.py defaults, trained by main_ema.py with an EMA of decay 0.99982 whose weights are the released
# ones). Train / test:
#   tools/dist_train.sh configs/classification/polapp-b3_8xb128_in1k.py 8 [--amp]
#   tools/test.py configs/classification/polapp-b3_8xb128_in1k.py CHECKPOINT   (official PolaFormer++ files load as is)
# The checkpoint (EMA weights) feeds the dense configs' PolaPP backbone: init_cfg=dict(type='Pretrained', ...).
_base_ = ['./polapp-b0_8xb256_in1k.py']  # the official recipe; this size's own settings below

model = dict(arch='b3', drop_path_rate=0.15)
train_dataloader = dict(batch_size=128)
