# FLatten-Swin-B (89.0 M parameters): ImageNet-1k from scratch with the official recipe of
# LeapLabTHU/FLatten-Transformer (cfgs/flatten_swin_b.yaml), which is the Pola-Swin-B recipe
# (../pola-swin-b_8xb64_in1k.py) with the focused linear attention (FLatten Transformer, ICCV 2023).
#   tools/dist_train.sh configs/classification/flatten/flatten-swin-b_8xb64_in1k.py 8 [--amp]
#   tools/test.py configs/classification/flatten/flatten-swin-b_8xb64_in1k.py CHECKPOINT  (official files load as is)
_base_ = ['../pola-swin-b_8xb64_in1k.py']

model = dict(kind='flatten')
