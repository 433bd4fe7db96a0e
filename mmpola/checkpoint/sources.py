"""Where the official ImageNet-1k weights of each backbone are published: the one table.

Each entry says what its release publishes and, where that is a direct download verified in the
release's own README, the URL. The timm entries (``pretrained=True``, through timm's cache:
:mod:`mmpola.models.pretrained`) and the ``init_cfg`` of the base model configs
(``configs/_base_/models/<name>.py``, downloaded by :func:`mmpola.checkpoint.reading.download_checkpoint`
into torch hub's cache) use these URLs; docs/models.md shows the table.

What the official releases publish (their READMEs, read at the commits noted in docs/models.md):

* FLatten Transformer (LeapLabTHU/FLatten-Transformer): one TsinghuaCloud link per model for FLatten-PVT-T,
  FLatten-PVTv2-b0, FLatten-Swin-T/S/B, FLatten-Swin-B at 384 and FLatten-CSwin-T. No FLatten-PVT-S/M/L,
  FLatten-PVTv2-b1..b4 or FLatten-CSwin-S/B/B-384 weights (their configs only).
* InLine (LeapLabTHU/InLine): one TsinghuaCloud link per model for InLine-DeiT-T/S/B, InLine-PVT-T/S/M/L,
  InLine-Swin-T/S/B and InLine-CSwin-T/S/B (at 224; none at 384).
* PolaFormer (ZacharyMeng/PolaFormer): the weights are the files of the Hugging Face repository
  ``ZachMeng/PolaFormer``; their file names are not listed anywhere mmpola could check, so no entry names
  a file (download the file from the repository page and pass it). The TsinghuaCloud links an earlier
  revision of its README showed under "Pretrained Models" are the FLatten repository's links (the same
  file ids as FLatten-PVT-T, FLatten-PVTv2-b0 and FLatten-Swin-T/S/B): FLatten files, not PolaFormer
  weights, and never used here.
* PolaFormer++ (ZacharyMeng/PolaFormerPP): a Baidu Netdisk share with an extraction code, no direct download.
"""
import hashlib
import os.path as osp
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlparse

from mmpola.errors import MMPolaUserError

__all__ = ['WeightSource', 'WEIGHT_SOURCES', 'weight_source', 'pretrained_url', 'cache_file_name',
           'no_download_message', 'NoPublishedWeightsError']

_FLATTEN = 'https://github.com/LeapLabTHU/FLatten-Transformer'
_INLINE = 'https://github.com/LeapLabTHU/InLine'
_POLA = 'https://github.com/ZacharyMeng/PolaFormer'
_POLA_HF = 'https://huggingface.co/ZachMeng/PolaFormer/tree/main'
_POLAPP = 'https://github.com/ZacharyMeng/PolaFormerPP'
_TSINGHUA = 'https://cloud.tsinghua.edu.cn/f/{}/?dl=1'


class NoPublishedWeightsError(MMPolaUserError, RuntimeError):
    """No direct download of official weights is known for this model."""


@dataclass(frozen=True)
class WeightSource:
    """What one official release publishes for one model.

    Attributes:
        name: the timm entry / base model config name (``'flatten_pvt_tiny'``).
        release: the official repository's page.
        url: direct download of the ImageNet-1k checkpoint (checked in the release's README), or None.
        note: where the weights are when there is no direct download, or that there are none.
        published: False when the release publishes no weights for the model (its config only).
    """
    name: str
    release: str
    url: Optional[str] = None
    note: str = ''
    published: bool = True

    @property
    def file_name(self):
        """The name the download is cached under (torch hub's ``checkpoints`` folder, shared with timm)."""
        return f'{self.name}_in1k_official.pth'


def _tsinghua(name, release, file_id):
    return WeightSource(name, release, url=_TSINGHUA.format(file_id))


def _unpublished(name, release, note):
    return WeightSource(name, release, note=note, published=False)


_POLA_NOTE = (f'the PolaFormer release publishes its weights on Hugging Face ({_POLA_HF}); mmpola has not '
              'verified their file names')
_POLAPP_NOTE = ('the PolaFormer++ release shares its weights on Baidu Netdisk (link and extraction code in its '
                'README); there is no direct download')

WEIGHT_SOURCES = {s.name: s for s in [
    _tsinghua('flatten_pvt_tiny', _FLATTEN, '3ab1d773f19d45648690'),
    _unpublished('flatten_pvt_small', _FLATTEN, 'not published by the FLatten release'),
    _unpublished('flatten_pvt_medium', _FLATTEN, 'not published by the FLatten release'),
    _unpublished('flatten_pvt_large', _FLATTEN, 'not published by the FLatten release'),
    _tsinghua('flatten_swin_tiny', _FLATTEN, 'e1518e76703e4e57a7f2'),
    _tsinghua('flatten_swin_small', _FLATTEN, '94188e52af354bf4a88b'),
    _tsinghua('flatten_swin_base', _FLATTEN, '7a9e5186bad04e7fb3a9'),
    _tsinghua('flatten_swin_base_384', _FLATTEN, '0d0330cf2e5249f1abb6'),  # fine-tuned at 384 (85.0 top-1)
    _tsinghua('inline_pvt_tiny', _INLINE, '90ac52b1555b401eb5e6'),
    _tsinghua('inline_pvt_small', _INLINE, '1ab953b2479d433080a3'),
    _tsinghua('inline_pvt_medium', _INLINE, 'a72aec31e6084bc0a280'),
    _tsinghua('inline_pvt_large', _INLINE, 'efd91318ba964f01b288'),  # its config: cfgs/inline_pvt_b.yaml
    _tsinghua('inline_swin_tiny', _INLINE, '32810869fcc34410966b'),
    _tsinghua('inline_swin_small', _INLINE, 'e9657fd247c04c7cb1a1'),
    _tsinghua('inline_swin_base', _INLINE, 'bf23564bb64c420aafe1'),
    _tsinghua('flatten_pvt_v2_b0', _FLATTEN, '5d1f01532b104da28e7b'),
    *[_unpublished(f'flatten_pvt_v2_b{i}', _FLATTEN, 'not published by the FLatten release') for i in range(1, 5)],
    _tsinghua('flatten_cswin_tiny', _FLATTEN, '48ba765ba8b0451d9d5a'),
    *[_unpublished(f'flatten_cswin_{size}', _FLATTEN, 'not published by the FLatten release')
      for size in ('small', 'base', 'base_384')],
    _tsinghua('inline_cswin_tiny', _INLINE, '49fa2ecc543647c4b970'),
    _tsinghua('inline_cswin_small', _INLINE, '59f4e65f776f4052b93c'),
    _tsinghua('inline_cswin_base', _INLINE, '91e17121df284ae38521'),
    _unpublished('inline_cswin_base_384', _INLINE, 'not published by the InLine release (224 weights only)'),
    _tsinghua('inline_deit_tiny', _INLINE, '1d6b8191ad6d4114b291'),
    _tsinghua('inline_deit_small', _INLINE, '2f3898b07e9247f3beb3'),
    _tsinghua('inline_deit_base', _INLINE, '10bdd726d4b0435eb34e'),
    *[WeightSource(f'pola_{size}', _POLA, note=_POLA_NOTE) for size in (
        'pvt_tiny', 'pvt_small', 'pvt_medium', 'pvt_large', 'swin_tiny', 'swin_small', 'swin_base', 'swin_base_384')],
    *[WeightSource(f'polapp_b{i}', _POLAPP, note=_POLAPP_NOTE) for i in range(6)],
]}


def weight_source(name):
    """The :class:`WeightSource` of a timm entry or base model config name."""
    try:
        return WEIGHT_SOURCES[name]
    except KeyError:
        raise KeyError(f'no weight source for {name!r}; known: {", ".join(sorted(WEIGHT_SOURCES))}') from None


def pretrained_url(name):
    """The verified download URL of ``name``'s official ImageNet weights, or None."""
    return weight_source(name).url


def cache_file_name(url):
    """File name a downloaded checkpoint is cached under: the table's name for its URLs, else the last
    part of the URL's path (a digest of the URL when that is empty, as for ``.../f/<id>/?dl=1`` links)."""
    for source in WEIGHT_SOURCES.values():
        if source.url == url:
            return source.file_name
    name = osp.basename(urlparse(url).path)
    return name or f'download_{hashlib.sha256(url.encode()).hexdigest()[:16]}.pth'


def no_download_message(source):
    pass_file = (f"timm.create_model('{source.name}', pretrained=True, pretrained_cfg_overlay=dict(file=PATH)) "
                 f"or checkpoint_path=PATH; configs: --cfg-options model.backbone.init_cfg.checkpoint=PATH")
    if not source.published:
        return (f'no official ImageNet weights exist for {source.name}: {source.note}. Train them (its recipe in '
                f'configs/classification) or start from a file of your own: {pass_file}')
    return (f'no direct download of official ImageNet weights is known for {source.name}: {source.note}. '
            f'Download the file from {source.release} yourself and pass it: {pass_file}')
