"""timm's ``pretrained=True`` for mmpola's entries: the official file of each release
(:mod:`mmpola.checkpoint.sources`), downloaded once by timm's own cache."""
import os.path as osp

from mmpola.checkpoint.reading import download_error
from mmpola.checkpoint.sources import NoPublishedWeightsError, no_download_message, weight_source

__all__ = ['timm_pretrained_file', 'timm_pretrained_overlay']


def timm_pretrained_file(name):
    """Local path of ``name``'s official weights for ``timm.create_model(name, pretrained=True)``.

    Downloaded once by timm's own cache (``timm.models._hub.download_cached_file``, torch hub's ``checkpoints``
    folder) under :attr:`WeightSource.file_name`: timm's URL loading would name the cached file after the
    URL's path, which these links leave empty.

    Raises:
        NoPublishedWeightsError: the release publishes no direct download for ``name``.
        CheckpointFileError: the download failed (no network): the message says how to pass a local file
            and where in the cache a copy is found.
    """
    from timm.models._hub import download_cached_file, get_cache_dir

    source = weight_source(name)
    if source.url is None:
        raise NoPublishedWeightsError(no_download_message(source))
    try:
        return download_cached_file((source.url, source.file_name), check_hash=False, progress=True)
    except Exception as e:
        error = download_error(source.url, e, cache_path=osp.join(get_cache_dir(), source.file_name),
                               local_file=f"timm.create_model('{name}', pretrained=True, "
                               "pretrained_cfg_overlay=dict(file='checkpoints/file.pth'))")
        if error is None:
            raise
        raise error from e


def timm_pretrained_overlay(name, overlay=None):
    """``pretrained_cfg_overlay`` for ``timm.create_model(name, pretrained=True, ...)``: the user's own
    source (``file``, ``state_dict``, ``url``, ``hf_hub_id``) when given, else the official file
    (:func:`timm_pretrained_file`)."""
    overlay = dict(overlay or {})
    if not any(overlay.get(key) for key in ('file', 'state_dict', 'url', 'hf_hub_id')):
        overlay['file'] = timm_pretrained_file(name)
    return overlay
