"""Checkpoints: safe reading (:mod:`.reading`), where official weights are published (:mod:`.sources`),
the tensors of a container (:mod:`.state_dict`), "is this file for this model" (:mod:`.signatures`) and
loading into mmpola's models (:mod:`.loading`).

This package knows nothing of mmpola's models: they bring their own filter and key signature
(``model.checkpoint_filter``, ``model.checkpoint_signature()``), and mmpola.models registers what
its models' files look like (:func:`register_known_models`) for the messages.
"""
from .loading import PARTIAL_OPTION, LoadReport, checkpoint_source, load_checkpoint, prepare_state_dict, read_checkpoint
from .signatures import (
    BlockLayout,
    KeySignature,
    KnownModel,
    LookAlike,
    block_layout,
    describe_backbone,
    describe_checkpoint,
    identify,
    key_pattern,
    register_known_models,
)
from .state_dict import (
    CheckpointMismatchError,
    NonFiniteCheckpointError,
    check_finite,
    extract_state_dict,
    find_key_prefix,
    resize_state_dict,
)

__all__ = ['read_checkpoint', 'extract_state_dict', 'find_key_prefix', 'resize_state_dict', 'load_checkpoint',
           'prepare_state_dict', 'PARTIAL_OPTION',
           'checkpoint_source', 'describe_checkpoint', 'describe_backbone', 'identify',
           'key_pattern', 'KeySignature', 'KnownModel', 'LookAlike', 'register_known_models', 'LoadReport',
           'CheckpointMismatchError', 'NonFiniteCheckpointError', 'check_finite', 'BlockLayout', 'block_layout']
