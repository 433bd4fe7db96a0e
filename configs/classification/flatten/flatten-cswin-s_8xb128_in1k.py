# FLatten-CSWin-S (35.5 M parameters): the FLatten release publishes its recipe, no weights. ImageNet-1k from
# scratch with the official recipe of LeapLabTHU/FLatten-Transformer (cfgs/flatten_cswin_s.yaml on config.py,
# trained by main_ema.py), 8 GPUs x 128 images (lr 5e-4 x 1024 / 512): the CSWin schedule of
# ../_base_/schedules/cswin_310e.py, weight decay 0.05, drop path 0.4, CSWin with the focused linear attention
# in stages 1-2 (the released layout 'LLSS') and an EMA of the weights (timm's ModelEma in the official run,
# decay 0.99984: its README (--model-ema --model-ema-decay 0.99984 for T and S, 0.99982 for B)); validation
# and checkpoints use the averaged weights. Every number and its source: docs/recipes.md.
#   tools/dist_train.sh configs/classification/flatten/flatten-cswin-s_8xb128_in1k.py 8
#   tools/test.py configs/classification/flatten/flatten-cswin-s_8xb128_in1k.py CHECKPOINT
# (official FLatten-CSWin files load as they are: their EMA weights when they hold them). The checkpoint
# feeds the dense configs' backbone (type='FLattenCSWin', arch='small').
_base_ = ['./flatten-cswin-t_8xb256_in1k.py']

model = dict(arch='small', drop_path_rate=0.4)
train_dataloader = dict(batch_size=128)
