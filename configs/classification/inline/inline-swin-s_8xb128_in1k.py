# InLine-Swin-S (50 M parameters): ImageNet-1k from scratch with the official recipe of LeapLabTHU/InLine
# (cfgs/inline_swin_s.yaml), which is the Pola-Swin-S recipe (../pola-swin-s_8xb128_in1k.py) with the
# injective linear attention (InLine, NeurIPS 2024) in the released layout 'IISS'. The official run
# trained with mixed precision: --amp.
#   tools/dist_train.sh configs/classification/inline/inline-swin-s_8xb128_in1k.py 8 --amp
#   tools/test.py configs/classification/inline/inline-swin-s_8xb128_in1k.py CHECKPOINT  (official files load as is)
_base_ = ['../pola-swin-s_8xb128_in1k.py']

model = dict(kind='inline', attn_type='IISS')
