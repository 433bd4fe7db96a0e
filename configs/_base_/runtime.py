# mmpola's run-time guarantees, shared by every detection and segmentation config (the classification
# configs have them in configs/classification/_base_/default_runtime.py). What each hook guarantees:
# docs/reliability.md. A task config inherits this file next to its mmdet / mmseg base and sets its
# checkpoint hook:
#
#   _base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py', '../_base_/models/pola_pvt_tiny.py',
#             '../_base_/runtime.py']
#   default_hooks = dict(checkpoint=dict(type='mmpola.SafeCheckpointHook'))
#
# (mmdet's and mmseg's bases define `default_hooks`, and mmengine refuses a key that two bases both
# define, so the type of the checkpoint hook is set by the inheriting config.) Runs started with
# mmdet's or mmseg's own tools/train.py get the same hooks: they are in the config.
#
#   mmpola.SafeCheckpointHook  (default_hooks.checkpoint) CheckpointHook with atomic saves, old files
#                              removed only after the new one is complete, a resumable checkpoint on SIGTERM
#   mmpola.RandomStateHook     random generator states in every checkpoint: --resume repeats the interrupted run
#   mmpola.NonFiniteLossHook   a NaN / inf loss stops the run before the optimizer step (or the step is
#                              skipped), naming the iteration, the loss terms and the images
#   mmpola.NonFinitePixelsHook an input image with NaN / inf pixels stops the run (training, validation,
#                              testing) before it is batched with others, naming the file (or is skipped)
#   mmpola.CheckpointFitHook   a load_from / test checkpoint that fits less than `checkpoint_min_loaded` of
#                              the model's weights is refused (a checkpoint of another model)
#   mmpola.WorkDirHook         a work dir deleted during the run is recreated (one warning) before the next
#                              log or checkpoint is written there, instead of a traceback and a lost checkpoint
#
# Their settings, which --cfg-options can change with any train.py:
#   --cfg-options nonfinite_loss.action=skip nonfinite_loss.max_skips=20
#   --cfg-options nonfinite_pixels.action=skip
#   --cfg-options checkpoint_min_loaded=0
nonfinite_loss = dict(action='stop', max_skips=10)
nonfinite_pixels = dict(action='stop')
checkpoint_min_loaded = 0.5
custom_hooks = [
    dict(type='mmpola.RandomStateHook'),
    dict(type='mmpola.NonFiniteLossHook'),
    dict(type='mmpola.NonFinitePixelsHook'),
    dict(type='mmpola.CheckpointFitHook'),
    dict(type='mmpola.WorkDirHook'),
]
