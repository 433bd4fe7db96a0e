"""What an OpenMMLab user looks for in a package's ``apis`` (as ``mmdet.apis``, ``mmseg.apis``): the
inferencers, mmdet's ``DetInferencer`` and mmseg's ``MMSegInferencer`` extended for image folders
(:mod:`mmpola.inferencers`, where they are made; importing this module needs neither library)::

    from mmpola.apis import DetInferencer, SegInferencer
"""
__all__ = ['DetInferencer', 'SegInferencer']  # noqa: F822 (made on first use, by mmpola.inferencers)


def __getattr__(name):
    if name in __all__:
        from . import inferencers
        return getattr(inferencers, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
