# Runtime of the ImageNet runs: log every 100 iterations, validate and checkpoint every epoch
# (keep the last 3 and the best top-1), seed 0 (+ rank), mmpola's run-time guarantees (the hooks of
# configs/_base_/runtime.py, here named entries of default_hooks so that a config replacing
# custom_hooks keeps them; docs/reliability.md), EMA available but off:
#   tools/train.py CONFIG --cfg-options custom_hooks.0.enabled=True [custom_hooks.0.momentum=1e-4]
# (momentum 1e-4 = the 0.9999 decay of FLatten's main_ema.py; validation and checkpoints then
# use the averaged weights).
default_scope = 'mmengine'  # the classification modules live in mmengine's root registries
custom_imports = dict(imports=['mmpola', 'mmpola.classification'], allow_failed_imports=False)

default_hooks = dict(
    runtime_info=dict(type='RuntimeInfoHook'),
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=100),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='mmpola.SafeCheckpointHook', interval=1, max_keep_ckpts=3, save_best='accuracy/top1',
                    rule='greater'),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    random_state=dict(type='mmpola.RandomStateHook'),
    nonfinite_loss=dict(type='mmpola.NonFiniteLossHook'),
    nonfinite_pixels=dict(type='mmpola.NonFinitePixelsHook'),
    checkpoint_fit=dict(type='mmpola.CheckpointFitHook'),
    work_dir=dict(type='mmpola.WorkDirHook'),
)
# settings of the hooks above (--cfg-options nonfinite_loss.action=skip, nonfinite_pixels.action=skip,
# checkpoint_min_loaded=0)
nonfinite_loss = dict(action='stop', max_skips=10)
nonfinite_pixels = dict(action='stop')
checkpoint_min_loaded = 0.5
custom_hooks = [dict(type='SwitchableEMAHook', enabled=False, momentum=1e-4, priority='ABOVE_NORMAL')]

env_cfg = dict(
    cudnn_benchmark=True,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'),
)
vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='Visualizer', vis_backends=vis_backends)
log_processor = dict(type='LogProcessor', window_size=50, by_epoch=True)
log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=0, diff_rank_seed=True)
