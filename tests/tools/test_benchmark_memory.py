"""tools/benchmark.py memory: what a training step keeps, counted on the CPU in a dry run: the saved activations
by the part that saved them, the parameters, gradients and optimizer state; two detectors that differ in their
backbone keep the same in their neck and heads; the recomputing linear layers keep less."""
import os.path as osp

import pytest
import torch

from tests.fixtures.paths import CONFIGS, PYTHON
from tests.fixtures.runs import run_tool
from tests.fixtures.tools import load_tool

MEMORY = load_tool('benchmark_memory')
HOST = load_tool('benchmark_host')
RETINANET = osp.join(CONFIGS, 'detection', 'retinanet_pola-pvt-t_fpn_1x_coco.py')
RETINANET_REFERENCE = 'mmdet::pvt/retinanet_pvt-t_fpn_1x_coco.py'


def test_saved_storages_are_counted_once_for_the_part_that_saved_them_first():
    x = torch.randn(4, 8, requires_grad=True)
    part = ['first']

    def forward():
        y = x.sin()  # saves x (4 x 8 float32)
        part[0] = 'second'
        z = x.cos() * y  # saves x again (counted once, for 'first'), and y and cos(x)
        return z.sum()

    _, saved = MEMORY.saved_for_backward(forward, lambda: part[0])
    assert saved == {'first': 4 * 8 * 4, 'second': 2 * 4 * 8 * 4}
    _, saved = MEMORY.saved_for_backward(forward)
    assert saved == {None: 3 * 4 * 8 * 4}


def test_lasting_bytes_count_adamw_s_two_moments_and_leave_the_weights_as_they_were():
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    model[1].bias.requires_grad_(False)
    before = [p.detach().clone() for p in model.parameters()]
    params, grads, state = MEMORY.lasting_bytes(model, dict(optimizer=dict(type='AdamW', lr=1.0, weight_decay=0.5)))
    assert params == (8 * 4 + 4 + 4 * 2 + 2) * 4 and grads == params - 2 * 4
    assert 2 * grads <= state <= 2 * grads + 3 * 8  # the moments, and a step count per parameter
    assert all(torch.equal(p, b) and p.grad is None for p, b in zip(model.parameters(), before))


def test_half_products_computed_in_float32_keep_what_autograd_saves():
    conv, linear = torch.nn.Conv2d(4, 6, 3), torch.nn.Linear(6, 5)
    x = torch.randn(2, 4, 9, 9)

    def forward():
        with torch.autocast('cpu', torch.bfloat16):
            return linear(conv(x).relu().mean((2, 3)))
    plain, saved = MEMORY.saved_for_backward(forward)
    with MEMORY.HalfProductsInFloat32():
        widened, widened_saved = MEMORY.saved_for_backward(forward)
    assert widened.dtype == plain.dtype == torch.bfloat16 and widened_saved == saved
    torch.testing.assert_close(widened.float(), plain.float(), rtol=0.02, atol=0.02)


def test_cuda_autocast_lists_keep_what_a_gpu_s_autocast_keeps_and_leave_the_cpu_s_as_they_were():
    """A GPU's autocast runs softmax, LayerNorm, sums and losses in float32 whatever their inputs' precision, the
    CPU's keeps half results: inside the context the CPU's autocast does as CUDA's, and autograd saves what it
    saves on a GPU (an explicit attention's float32 probabilities beside their half copy for the product)."""
    import torch.nn.functional as F
    half = torch.randn(4, 8, dtype=torch.float16)
    q, k, v = (torch.randn(2, 16, 8, requires_grad=True) for _ in range(3))

    def attention():
        with torch.autocast('cpu', torch.float16):
            return (q @ k.transpose(1, 2)).softmax(-1) @ v

    def dtypes():
        with torch.autocast('cpu', torch.float16):
            return (half.softmax(-1).dtype, F.layer_norm(half, (8, )).dtype, half.sum().dtype,
                    half.sum(0, dtype=torch.float16).dtype, half.softmax(-1, torch.float16).dtype,
                    torch.addcmul(half, half.float(), half).dtype,
                    torch.mv(torch.randn(3, 8), torch.randn(8)).dtype,
                    F.binary_cross_entropy_with_logits(half, half.float().sigmoid()).dtype)
    f16, f32 = torch.float16, torch.float32
    cpu_lists = (f16, f16, f16, f16, f16, f32, f32, f32)  # the CPU's own loss kernel casts already
    _, cpu_saved = MEMORY.saved_for_backward(attention)
    assert dtypes() == cpu_lists
    with HOST.CudaAutocastLists():
        assert dtypes() == (f32, f32, f32, f16, f16, f32, f16, f32)  # an op's own dtype wins
        out, gpu_saved = MEMORY.saved_for_backward(attention)
        assert half.softmax(-1).dtype == f16  # outside an autocast region nothing changes
    # q and k (half copies), the probabilities in half, and v's half copy; on a GPU the probabilities in float32 too
    assert out.dtype == f16 and gpu_saved[None] == cpu_saved[None] + 2 * 16 * 16 * 4
    out.float().sum().backward()  # the saved tensors make the backward
    assert all(t.grad is not None and t.grad.dtype == f32 for t in (q, k, v))
    assert dtypes() == cpu_lists  # the CPU's kernels again (its own float32 loss kernel included)


def test_the_parts_beyond_the_backbone_get_the_same_weights_whatever_the_backbone_drew():
    def detector(width):
        model = torch.nn.Module()
        model.backbone = torch.nn.Linear(3, width)  # draws as many numbers as its size
        model.neck = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3), torch.nn.GroupNorm(2, 4))
        model.head = torch.nn.Linear(4, 2)
        return model
    first, second = detector(5), detector(9)
    for model in (first, second):
        MEMORY.same_weights_beyond_the_backbone(model, seed=0)
    for name in ('neck', 'head'):
        for a, b in zip(getattr(first, name).parameters(), getattr(second, name).parameters()):
            assert torch.equal(a, b)


def test_roi_layers_run_torchvision_s_roi_align():
    from mmpola.runtime.config import load_config
    cfg = load_config(osp.join(CONFIGS, 'detection', 'mask-rcnn_pola-swin-t_fpn_ms-crop-3x_coco.py'))
    roi_head = cfg.model.roi_head
    assert MEMORY.roi_layers_on_torchvision(cfg.model) == 2  # the boxes' and the masks' extractors
    assert all(extractor.roi_layer.use_torchvision
               for extractor in (roi_head.bbox_roi_extractor, roi_head.mask_roi_extractor))


def _rows(log):
    rows = {}
    for line in log.splitlines():
        if line.startswith(('| retinanet_', '| mmdet::retinanet_')):
            cells = [c.strip() for c in line.strip('|').split('|')]
            rows[cells[0]] = cells[1:]
    return rows


def test_memory_counts_a_pola_detector_against_its_counterpart():
    log = run_tool([PYTHON, 'tools/benchmark.py', 'memory', RETINANET, RETINANET_REFERENCE, '--pairs', '--img-scale',
                    '160', '128', '--batch-size', '1', '--also-with', 'MMPOLA_RECOMPUTE=triton'])
    assert '# benchmark memory' in log and 'dtype: autocast float16' in log
    rows = _rows(log)
    pola, recomputed, mmdet = (rows['retinanet_pola-pvt-t_fpn_1x_coco'],
                               rows['retinanet_pola-pvt-t_fpn_1x_coco, MMPOLA_RECOMPUTE=triton'],
                               rows['mmdet::retinanet_pvt-t_fpn_1x_coco'])
    assert len(rows) == 3  # no variable's row for mmdet's config: its backbone reads none of them
    for cells in (pola, recomputed, mmdet):
        height, width = (int(side) for side in cells[0].split('x'))
        assert height % 32 == 0 and width % 32 == 0 and max(height, width) <= 160 and cells[1] == '1'
        params, grads, state, backbone, neck, rest, total = (float(c) for c in cells[2:9])
        assert params > 0 and grads == params and state == pytest.approx(2 * grads, abs=0.2)  # AdamW
        assert backbone > 0 and neck > 0 and rest > 0
        assert total == pytest.approx(params + grads + state + backbone + neck + rest, abs=0.4)
    # the same zero features, data, neck and heads: the same saved in the neck and the rest
    assert pola[6:8] == recomputed[6:8] == mmdet[6:8] and pola[0] == mmdet[0]
    assert float(recomputed[5]) < float(pola[5])  # the recomputing linear layers keep less
    assert float(pola[9].rstrip('x')) == pytest.approx(float(pola[8]) / float(mmdet[8]), abs=0.01)
    assert float(pola[10].rstrip('x')) == pytest.approx(float(pola[5]) / float(mmdet[5]), abs=0.01)
    assert mmdet[9:] == ['-', '-']
    assert '[3] mmdet::retinanet_pvt-t_fpn_1x_coco: ' in log
