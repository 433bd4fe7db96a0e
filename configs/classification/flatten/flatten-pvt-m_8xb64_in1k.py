# FLatten-PVT-M (37.2 M parameters): ImageNet-1k from scratch with the official recipe of
# LeapLabTHU/FLatten-Transformer (cfgs/flatten_pvt_m.yaml), which is the Pola-PVT-M recipe
# (../pola-pvt-m_8xb64_in1k.py) with the focused linear attention (FLatten Transformer, ICCV 2023).
#   tools/dist_train.sh configs/classification/flatten/flatten-pvt-m_8xb64_in1k.py 8 [--amp]
#   tools/test.py configs/classification/flatten/flatten-pvt-m_8xb64_in1k.py CHECKPOINT  (official files load as is)
_base_ = ['../pola-pvt-m_8xb64_in1k.py']

model = dict(kind='flatten')
