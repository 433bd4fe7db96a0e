"""A checkpoint of other blocks than the model (another depth, width or per-stage layout) and one with
NaN / inf weights are refused on every loading path of the models: the backbone loader (``init_cfg``),
the classifier's loader and ``load_state_dict``, timm's ``checkpoint_path`` and pretrained file. Each
message names what the file holds and what the model is; the blocks both have load only on purpose
(``strict=False``, timm's ``pretrained_strict=False``).

The files come from the golden mini architectures and deeper ones of the same widths, saved in the
official key layout (the classifier's keys without ``backbone.``); the released sizes are compared on
the meta device (no weights)."""
import re
from collections import OrderedDict

import pytest
import timm
import torch

import mmpola  # noqa: F401
from mmpola.checkpoint import CheckpointMismatchError, NonFiniteCheckpointError, load_checkpoint
from mmpola.models import ImageClassifier, PolaPVT, PolaSwin

# the golden mini architectures (tests/data/pola_*_mini_official.pth) and a deeper one of the same widths
ARCH = {'pvt': dict(embed_dims=[16, 32, 80, 128], num_heads=[1, 2, 5, 8], mlp_ratios=[8, 8, 4, 4]),
        'swin': dict(embed_dims=16, num_heads=[1, 2, 4, 8])}
DEPTHS = {'pvt': ([1, 1, 2, 1], [1, 2, 3, 1]), 'swin': ([2, 2, 2, 2], [2, 2, 4, 2])}
BACKBONE = {'pvt': PolaPVT, 'swin': PolaSwin}
EXTRA = {'attn_type': 'LLSS'}


def _extra(family):
    return EXTRA if family == 'swin' else {}


def backbone(family, depths, **kwargs):
    return BACKBONE[family](arch=dict(ARCH[family], depths=depths), **_extra(family), **kwargs)


def classifier(family, depths, **kwargs):
    return ImageClassifier(family=family, kind='pola', arch=dict(ARCH[family], depths=depths), num_classes=10,
                          **dict(_extra(family), **kwargs))


def official_file(tmp_path, family, depths, name='official.pth', nan_key=None, **kwargs):
    """(path, state dict): a classifier of these blocks saved as the official release does
    (``{'model': keys without 'backbone.', 'config': ...}``); ``nan_key``: that weight holds one NaN."""
    torch.manual_seed(0)
    state = OrderedDict((k[len('backbone.'):] if k.startswith('backbone.') else k, v)
                        for k, v in classifier(family, depths, **kwargs).state_dict().items())
    if nan_key is not None:
        state[nan_key] = state[nan_key].clone()
        state[nan_key].view(-1)[3] = float('nan')
    path = tmp_path / name
    torch.save({'model': state, 'config': {'MODEL': {'TYPE': family}}}, path)
    return str(path), state


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_a_deeper_file_of_the_same_widths_is_refused_by_the_backbone_loader(family, tmp_path):
    shallow, deep = DEPTHS[family]
    path, state = official_file(tmp_path, family, deep)
    model = backbone(family, shallow, init_cfg=dict(type='Pretrained', checkpoint=path))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointMismatchError) as error:
        model.init_weights()
    title = {'pvt': 'Pola-PVT', 'swin': 'Pola-Swin'}[family]
    text = str(error.value)
    model_name = f'Pola{family.upper() if family == "pvt" else "Swin"}'
    assert text.startswith(f'checkpoint {str(path)!r} does not fit {model_name}: '
                           f'the file holds {title}: {"-".join(map(str, deep))} blocks, the model is '
                           f'{title}: {"-".join(map(str, shallow))} blocks (other blocks per stage)'), text
    assert ("the model would get the first blocks of each of the file's stages and the others would stay unused"
            in text)
    assert text.endswith("to load the blocks both have on purpose: strict=False (init_cfg=dict(type='Pretrained', "
                         "checkpoint=..., strict=False), or load_checkpoint(..., strict=False)).")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items()), 'a refused file changed weights'

    # a shallower file: the model's deeper blocks would stay random
    path_t, _ = official_file(tmp_path, family, shallow, 'shallow.pth')
    with pytest.raises(CheckpointMismatchError, match='blocks of the model would stay randomly initialised'):
        load_checkpoint(backbone(family, deep), path_t)

    # on purpose: the blocks both have load, the rest is reported
    model = backbone(family, shallow, init_cfg=dict(type='Pretrained', checkpoint=path, strict=False))
    model.init_weights()
    report = load_checkpoint(backbone(family, shallow), path, strict=False)
    assert report.unexpected and all(torch.equal(v, state[k]) for k, v in model.state_dict().items() if k in state)


def test_released_sizes_are_named_and_widths_and_layouts_compared():
    """On the meta device: a Pola-PVT-S file for a Pola-PVT-T, a Pola-Swin-S and a Pola-Swin-B file for a
    Pola-Swin-T, a Pola-Swin file with Pola attention in every stage for one with the released LLSS."""
    with torch.device('meta'):
        pvt_t, pvt_s = PolaPVT(arch='tiny'), PolaPVT(arch='small')
        swin_t, swin_s, swin_b = PolaSwin(arch='tiny'), PolaSwin(arch='small'), PolaSwin(arch='base')
        swin_llll = PolaSwin(arch='tiny', attn_type='LLLL')
    with pytest.raises(CheckpointMismatchError) as error:
        load_checkpoint(pvt_t, {'model': pvt_s.state_dict()})
    assert ('the file holds Pola-PVT-S: 3-4-6-3 blocks, the model is Pola-PVT-T: 2-2-2-2 blocks (other blocks per '
            "stage)") in str(error.value)
    assert "build the backbone the file fits (arch='small')" in str(error.value)
    with pytest.raises(CheckpointMismatchError, match=r'the file holds Pola-Swin-S: 2-2-18-2 blocks, the model is '
                                                      r'Pola-Swin-T: 2-2-6-2 blocks'):
        load_checkpoint(swin_t, {'model': swin_s.state_dict()})
    with pytest.raises(CheckpointMismatchError, match=r'the file holds Pola-Swin-B: 2-2-18-2 blocks, widths '
                                                      r'128-256-512-1024, the model is Pola-Swin-T: 2-2-6-2 blocks, '
                                                      r'widths 96-192-384-768 \(other blocks per stage and widths\)'):
        load_checkpoint(swin_t, {'model': swin_b.state_dict()})
    with pytest.raises(CheckpointMismatchError, match=r'the file holds Pola-Swin: 2-2-6-2 blocks, attention LLLL, '
                                                      r'the model is Pola-Swin-T: 2-2-6-2 blocks, attention LLSS '
                                                      r'\(other attention per stage\)'):
        load_checkpoint(swin_t, {'model': swin_llll.state_dict()})


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_the_classifier_and_timm_refuse_a_file_of_other_blocks(family, tmp_path):
    shallow, deep = DEPTHS[family]
    path, state = official_file(tmp_path, family, deep)
    blocks = f'{"-".join(map(str, deep))} blocks'
    with pytest.raises(CheckpointMismatchError, match=f'the file holds Pola-(PVT|Swin): {blocks}'):
        classifier(family, shallow).load_checkpoint(path)
    with pytest.raises(CheckpointMismatchError, match=f'^the given state dict does not fit .*{blocks}.*'
                                                      'pretrained_strict=False'):
        classifier(family, shallow).load_state_dict(torch.load(path, weights_only=True)['model'])
    model = classifier(family, shallow)
    model.load_checkpoint(path, strict=False)  # on purpose
    assert torch.equal(model.head.weight, state['head.weight'])

    entry = f'pola_{family}_tiny'
    kwargs = dict(arch=dict(ARCH[family], depths=shallow), **_extra(family))
    with pytest.raises(CheckpointMismatchError, match=f'^the given state dict does not fit .*{blocks}'):
        timm.create_model(entry, checkpoint_path=path, num_classes=10, **kwargs)
    overlay = dict(file=path)
    with pytest.raises(CheckpointMismatchError, match=f"checkpoint '{re.escape(path)}' does not fit.*{blocks}"):
        timm.create_model(entry, pretrained=True, pretrained_cfg_overlay=overlay, num_classes=5, **kwargs)
    model = timm.create_model(entry, pretrained=True, pretrained_cfg_overlay=overlay, num_classes=5,
                              pretrained_strict=False, **kwargs)
    assert torch.equal(model.backbone.patch_embed1.proj.weight if family == 'pvt' else
                       model.backbone.patch_embed.proj.weight,
                       state['patch_embed1.proj.weight' if family == 'pvt' else 'patch_embed.proj.weight'])


@pytest.mark.parametrize('family', ['pvt', 'swin'])
def test_a_file_with_a_nan_weight_is_refused_on_every_path(family, tmp_path):
    shallow, _ = DEPTHS[family]
    key = 'block1.0.attn.qg.weight' if family == 'pvt' else 'layers.0.blocks.1.attn.qkvg.weight'
    path, _ = official_file(tmp_path, family, shallow, nan_key=key)
    message = (f'checkpoint {{}} holds non-finite weights: 1 of its \\d+ floating-point tensors have NaN or infinite '
               f'values \\({{}}{re.escape(key)} \\(1 NaN\\)\\), so a model loaded from it would predict nothing or '
               'train on NaN')
    quoted = "'" + re.escape(path) + "'"  # every loader names the file alike
    model = backbone(family, shallow, init_cfg=dict(type='Pretrained', checkpoint=path, strict=False))
    with pytest.raises(NonFiniteCheckpointError, match=message.format(quoted, '')):
        model.init_weights()
    with pytest.raises(NonFiniteCheckpointError, match=message.format(quoted, 'backbone.')):
        classifier(family, shallow).load_checkpoint(path, strict=False)
    with pytest.raises(NonFiniteCheckpointError, match=message.format(quoted, 'backbone.')):
        timm.create_model(f'pola_{family}_tiny', pretrained=True, pretrained_cfg_overlay=dict(file=path),
                          arch=dict(ARCH[family], depths=shallow), **_extra(family))
