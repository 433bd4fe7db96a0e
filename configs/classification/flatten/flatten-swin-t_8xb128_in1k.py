# FLatten-Swin-T (29.2 M parameters): ImageNet-1k from scratch with the official recipe of
# LeapLabTHU/FLatten-Transformer (cfgs/flatten_swin_t.yaml), which is the Pola-Swin-T recipe
# (../pola-swin-t_8xb128_in1k.py) with the focused linear attention (FLatten Transformer, ICCV 2023).
#   tools/dist_train.sh configs/classification/flatten/flatten-swin-t_8xb128_in1k.py 8 [--amp]
#   tools/test.py configs/classification/flatten/flatten-swin-t_8xb128_in1k.py CHECKPOINT  (official files load as is)
_base_ = ['../pola-swin-t_8xb128_in1k.py']

model = dict(kind='flatten')
