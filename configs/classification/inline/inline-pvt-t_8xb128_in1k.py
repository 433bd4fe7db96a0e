# InLine-PVT-T (12.0 M parameters): ImageNet-1k from scratch with the official recipe of
# LeapLabTHU/InLine (cfgs/inline_pvt_t.yaml), which is the Pola-PVT-T recipe
# (../pola-pvt-t_8xb128_in1k.py) with the injective linear attention (InLine, NeurIPS 2024).
#   tools/dist_train.sh configs/classification/inline/inline-pvt-t_8xb128_in1k.py 8 --amp  (official: fp16)
#   tools/test.py configs/classification/inline/inline-pvt-t_8xb128_in1k.py CHECKPOINT  (official files load as is)
_base_ = ['../pola-pvt-t_8xb128_in1k.py']

model = dict(kind='inline')
