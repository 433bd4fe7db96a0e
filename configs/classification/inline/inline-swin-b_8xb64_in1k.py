# InLine-Swin-B (88 M parameters): ImageNet-1k from scratch with the official recipe of LeapLabTHU/InLine
# (cfgs/inline_swin_b.yaml), which is the Pola-Swin-B recipe (../pola-swin-b_8xb64_in1k.py) with the
# injective linear attention (InLine, NeurIPS 2024) in the released layout 'IIMS2' (stage 3: two InLine
# blocks, then window softmax). The official run trained with mixed precision: --amp.
#   tools/dist_train.sh configs/classification/inline/inline-swin-b_8xb64_in1k.py 8 --amp
#   tools/test.py configs/classification/inline/inline-swin-b_8xb64_in1k.py CHECKPOINT  (official files load as is)
_base_ = ['../pola-swin-b_8xb64_in1k.py']

model = dict(kind='inline', attn_type='IIMS2')
