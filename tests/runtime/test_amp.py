"""BF16AmpOptimWrapper: bf16 autocast of the backbone only, on the CPU, reloadable state."""
import torch

from mmpola.runtime import BF16AmpOptimWrapper


class _Detector(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 1)
        self.seen = []

    def forward(self, x):
        feats = self.backbone(x)
        self.seen.append((feats.dtype, torch.is_autocast_enabled('cpu')))
        return self.head(feats)


def test_bf16_amp_autocasts_the_backbone_only():
    model = _Detector()
    wrapper = BF16AmpOptimWrapper(optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3))
    backbone_dtypes = []
    model.backbone.register_forward_hook(lambda m, a, out: backbone_dtypes.append(out.dtype))
    with wrapper.optim_context(model):
        loss = model(torch.randn(2, 4)).sum()
    assert backbone_dtypes == [torch.bfloat16]  # inside the backbone: bf16
    assert model.seen == [(torch.float32, False)]  # the head gets fp32 and runs without autocast
    wrapper.update_params(loss)
    model(torch.randn(2, 4))  # outside the context (validation): plain fp32
    assert backbone_dtypes[-1] == torch.float32 and model.seen[-1] == (torch.float32, False)

    state = wrapper.state_dict()
    state['loss_scaler'] = {'scale': 1024.0}  # as written by fp16 AmpOptimWrapper
    wrapper.load_state_dict(state)


def test_bf16_amp_whole_model_when_there_is_no_backbone():
    model = torch.nn.Linear(4, 4)
    wrapper = BF16AmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=1e-3))
    with wrapper.optim_context(model):
        assert model(torch.randn(2, 4)).dtype == torch.bfloat16
