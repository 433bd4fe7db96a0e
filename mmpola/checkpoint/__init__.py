"""Checkpoints: reading files safely (:mod:`.reading`) and loading them into mmpola's models (:mod:`.loading`)."""
from .loading import (
    CheckpointMismatchError,
    LoadReport,
    check_checkpoint_family,
    describe_checkpoint,
    extract_state_dict,
    find_key_prefix,
    load_pola_checkpoint,
    read_checkpoint,
    resize_state_dict,
)

__all__ = ['read_checkpoint', 'extract_state_dict', 'find_key_prefix', 'resize_state_dict',
           'load_pola_checkpoint', 'describe_checkpoint', 'check_checkpoint_family', 'LoadReport',
           'CheckpointMismatchError']
