"""The top-level config keys of mmpola's own run options, in one place: the modules that read them, and the
config loading, which knows them when it judges a ``--cfg-options`` key that the config does not define."""

__all__ = ['CHECKPOINT_MIN_LOADED', 'NONFINITE_LOSS', 'NONFINITE_PIXELS', 'RESUME_OR_START', 'DATA_HINT',
           'RUN_OPTIONS']

# the share of a checkpoint's weights that must load (``--cfg-options checkpoint_min_loaded=0`` loads anything)
CHECKPOINT_MIN_LOADED = 'checkpoint_min_loaded'
# what a non-finite loss does (``nonfinite_loss=dict(action=..., max_skips=...)``)
NONFINITE_LOSS = 'nonfinite_loss'
# what an input image with NaN / inf pixels does
NONFINITE_PIXELS = 'nonfinite_pixels'
# --resume may start a new run in a work dir without checkpoints
RESUME_OR_START = 'resume_or_start'
# the data check's hint where the data come from
DATA_HINT = 'data_hint'

RUN_OPTIONS = (CHECKPOINT_MIN_LOADED, NONFINITE_LOSS, NONFINITE_PIXELS, RESUME_OR_START, DATA_HINT)
