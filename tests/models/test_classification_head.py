"""The official classification heads: one per registered architecture, beside it in its module; the
classifier's modules are the head's (official names beside ``backbone.``), the backbone's filter
drops them from a classification file, and an architecture without a registered head gets PVT's."""
import pytest
import torch
import torch.nn as nn

from mmpola.models import ImageClassifier
from mmpola.models.classification_head import ClassificationHead, classification_head_of
from mmpola.registry import ARCHITECTURES, CLASSIFICATION_HEADS


def test_every_architecture_has_its_head_in_its_own_module():
    assert set(CLASSIFICATION_HEADS.module_dict) == set(ARCHITECTURES.module_dict)
    for family, architecture in ARCHITECTURES.module_dict.items():
        head = classification_head_of(family)
        assert issubclass(head, ClassificationHead) and head.family == family
        assert head.__module__ == architecture.__module__, family
        assert head.global_pools[-1] == '' and set(head.modules) >= {'norm', 'head'}


def test_an_architecture_without_a_head_gets_the_default():
    assert classification_head_of('no_such_family') is ClassificationHead


@pytest.mark.parametrize('family', sorted(ARCHITECTURES.module_dict))
def test_the_classifier_holds_the_backbone_and_the_heads_modules(family):
    with torch.device('meta'):
        model = ImageClassifier(family=family, num_classes=7)
    head = classification_head_of(family)
    assert model.head_settings is head
    assert {key.split('.', 1)[0] for key in model.state_dict()} <= {'backbone', *head.modules}
    assert isinstance(model.head, nn.Module) and model.global_pool == head.global_pools[0]
    for key, value in head.backbone_kwargs.items():
        with pytest.raises(ValueError, match=f'{key} is fixed by ImageClassifier'):
            ImageClassifier(family=family, **{key: value})


def test_the_backbones_filter_drops_the_heads_modules():
    """A classification file (official names, the head beside them) loads into the dense backbone with
    the head's modules dropped and every backbone key kept."""
    model = ImageClassifier(family='swin', arch=dict(embed_dims=16, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8]),
                            num_classes=5)
    official = {k[len('backbone.'):] if k.startswith('backbone.') else k: v for k, v in model.state_dict().items()}
    kept, dropped = model.backbone.checkpoint_filter(official)
    assert {k.split('.', 1)[0] for k in dropped} == {'norm', 'head'}
    assert set(kept) == set(model.backbone.state_dict()) - set(model.backbone.dense_only_modules())


def test_official_kwargs_are_read_by_their_architectures_head_only():
    swin = dict(embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24])
    parsed = classification_head_of('swin').official_kwargs(ARCHITECTURES.get('swin'), swin)
    assert parsed[0]['family'] == 'swin' and parsed[0]['arch']['embed_dims'] == 96
    assert classification_head_of('pvt').official_kwargs(ARCHITECTURES.get('pvt'), swin) is None
