"""The argument checks of the backbones and the classifier (mmpola.models.checks): each refusal one
PolaConfigError naming the value and the fix; valid values come back normalised."""
import pytest
import torch

from mmpola.errors import MMPolaUserError
from mmpola.models.checks import (
    PolaConfigError,
    check_frozen_stages,
    check_input,
    check_out_indices,
    check_pretrained_cfg,
    check_stage_string,
    resolve_arch,
    square_pretrain_size,
)


def test_the_error_is_a_user_error_and_a_value_error():
    assert issubclass(PolaConfigError, MMPolaUserError) and issubclass(PolaConfigError, ValueError)


def test_pretrained_cfg_keys_and_checkpoint():
    cfg = dict(type='Pretrained', checkpoint='a.pth', strict=False)
    assert check_pretrained_cfg(cfg, 'PolaPVT') is cfg
    with pytest.raises(PolaConfigError, match=r"PolaPVT: .*unknown key\(s\) 'strickt' \(did you mean 'strict'\?\)"):
        check_pretrained_cfg(dict(type='Pretrained', checkpoint='a.pth', strickt=False), 'PolaPVT')
    with pytest.raises(PolaConfigError, match='names no checkpoint; add checkpoint=PATH_OR_URL'):
        check_pretrained_cfg(dict(type='Pretrained'), 'PolaPVT')


def test_arch_presets_and_custom_dicts():
    settings = {'tiny': dict(depths=[2, 2, 2, 2], embed_dims=[64, 128, 320, 512])}
    assert resolve_arch('TINY', settings, ('depths', 'embed_dims'), 'PVT') == settings['tiny']
    with pytest.raises(PolaConfigError, match="unknown arch 'huge' for PVT; valid: tiny"):
        resolve_arch('huge', settings, ('depths', 'embed_dims'), 'PVT')
    with pytest.raises(PolaConfigError, match=r"missing \['embed_dims'\], unknown \['width'\]"):
        resolve_arch(dict(depths=[1] * 4, width=3), settings, ('depths', 'embed_dims'), 'PVT')


def test_stage_arguments():
    assert check_out_indices(3, 4, 'PVT') == (3,)
    with pytest.raises(PolaConfigError, match=r'out_indices \(0, 4\) out of range; valid stages are 0..3'):
        check_out_indices((0, 4), 4, 'PVT')
    assert check_frozen_stages(-1, 4, 'PVT') == -1
    with pytest.raises(PolaConfigError, match='frozen_stages=5 is beyond the depth'):
        check_frozen_stages(5, 4, 'PVT')
    assert check_stage_string('LLSS', 'LS', 4, 'attn_type') == 'LLSS'
    with pytest.raises(PolaConfigError, match="attn_type must be a string of 4 characters from 'LS', got 'LLX'"):
        check_stage_string('LLX', 'LS', 4, 'attn_type')
    assert square_pretrain_size(224) == (224, 224)
    with pytest.raises(PolaConfigError, match=r'Swin: pretrain_img_size must be square .* got \(224, 256\)'):
        square_pretrain_size((224, 256), 'Swin')


def test_input_images():
    check_input(torch.zeros(1, 3, 32, 32), 3, 32, 'PVT')
    with pytest.raises(PolaConfigError, match=r'built for 3 input channels, got 1 .* set in_channels=1'):
        check_input(torch.zeros(1, 1, 32, 32), 3, 32, 'PVT')
    with pytest.raises(PolaConfigError, match=r'expects a 4-D \(B, C, H, W\) image tensor, got \(3, 32, 32\)'):
        check_input(torch.zeros(3, 32, 32), 3, 32, 'PVT')
    with pytest.raises(PolaConfigError, match='input size 16x32 is smaller than the minimum 32x32'):
        check_input(torch.zeros(1, 3, 16, 32), 3, 32, 'PVT')
