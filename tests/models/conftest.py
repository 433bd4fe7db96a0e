"""Fixtures of the backbone / classifier tests (the golden data fixtures are in tests/conftest.py)."""
import pytest


@pytest.fixture(scope='session')
def mini_kwargs():
    """``mini_kwargs(family, constructor)``: backbone kwargs of a golden mini model."""
    return _mini_backbone_kwargs


def _mini_backbone_kwargs(family, constructor):
    """Backbone kwargs of a golden mini model from the official constructor kwargs."""
    c = constructor
    if family == 'pvt':
        return dict(arch={k: list(c[k]) for k in ('embed_dims', 'num_heads', 'mlp_ratios', 'depths')},
                    la_sr_ratios=c['la_sr_ratios'], attn_type=c['attn_type'],
                    pretrain_img_size=c['img_size'])
    return dict(arch=dict(embed_dims=c['embed_dim'], depths=list(c['depths']),
                          num_heads=list(c['num_heads'])),
                window_size=c['window_size'], attn_type=c['attn_type'],
                pretrain_img_size=c['img_size'])
