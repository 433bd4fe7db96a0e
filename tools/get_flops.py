#!/usr/bin/env python3
"""Parameters and FLOPs of a backbone or of a whole detector / segmentor config.

Usage:
    tools/get_flops.py --backbone PolaPVT --arch tiny                  # 224 x 224
    tools/get_flops.py --backbone PolaSwin --arch tiny --shape 800 1333
    tools/get_flops.py --backbone CSWinBackbone --arch tiny --cfg-options attn.type=pola   # any kind
    tools/get_flops.py --backbone CSWinBackbone --arch tiny --cfg-options attn_type=SSSS   # softmax
    tools/get_flops.py --backbone mmdet.SwinTransformer --shape 224 224
    tools/get_flops.py --config configs/detection/CONFIG.py --shape 800 1333
    tools/get_flops.py --config ... --per-module 2     # breakdown two module levels deep
    tools/get_flops.py --config configs/detection/*.py --shape 800 1280 --table   # model zoo columns

Counting: mmengine's ``FlopAnalyzer`` (``mmengine.analysis``, what mmdet's and mmseg's own
``tools/analysis_tools/get_flops.py`` use), so the figures are comparable with their model zoos. It traces
one forward pass at batch 1 and counts one multiply-accumulate per multiply-add of matrix products and
convolutions (mm/addmm/bmm/matmul/einsum/linear, hence the attention matmuls, conv; the two products
of ``scaled_dot_product_attention``, q k^T and weights x v, counted as its explicit formula), plus norms,
upsampling and adaptive pooling at one or a few operations per element; other element-wise ops,
activations, softmax and pow are not counted. mmdet and mmseg print this count as "Flops"; this tool
prints it as MACs, the papers' convention, and FLOPs = 2 x MACs. A config's model runs as in
mmdet's / mmseg's get_flops: the data preprocessor skipped, ``mode='tensor'`` (backbone, neck and heads,
no post-processing; a two-stage detector's second stage runs on the RPN's test-time proposals). The
attention runs its reference path (the official op order) while counting.
"""
import argparse
import os
import os.path as osp
import sys
from contextlib import contextmanager
from functools import partial

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
import _mmpola_tools  # noqa: E402,F401  (first: environment defaults before torch, repo on sys.path)
import torch  # noqa: E402
from mmengine.config import DictAction  # noqa: E402

MAC_CONVENTION = ("1 MAC = 2 FLOPs; counted by mmengine.analysis.FlopAnalyzer, as mmdet's / mmseg's get_flops, "
                  "which print the MACs as 'Flops' (matmul/linear/conv/einsum, norms, upsampling; other "
                  'element-wise ops, activations, softmax not counted)')


def count_parameters(model):
    """Number of parameters (trainable or not; buffers excluded)."""
    return sum(p.numel() for p in model.parameters())


@contextmanager
def _counting_mode(model):
    """The reference attention path (official op order, no fused autograd functions whose inner matmuls the
    tracer cannot see), no torch.compile of the Pola core, the library convolution for the depthwise convs
    (not Triton kernels, which the tracer cannot see either), no fused ``nn.MultiheadAttention`` fast path."""
    impls = [(m, m.attn_impl) for m in model.modules() if hasattr(m, 'attn_impl')]
    counting_env = {'MMPOLA_NO_COMPILE': '1', 'MMPOLA_DEPTHWISE_CONV': 'torch'}
    previous_env = {name: os.environ.get(name) for name in counting_env}
    os.environ.update(counting_env)
    mha = getattr(torch.backends, 'mha', None)
    previous_fastpath = mha.get_fastpath_enabled() if mha is not None else None
    try:
        for module, _ in impls:
            module.attn_impl = 'reference'
        if mha is not None:
            mha.set_fastpath_enabled(False)
        yield
    finally:
        for module, impl in impls:
            module.attn_impl = impl
        if mha is not None:
            mha.set_fastpath_enabled(previous_fastpath)
        for name, value in previous_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def sdpa_flop_jit(inputs, outputs):
    """MACs of ``aten::scaled_dot_product_attention`` (FlopAnalyzer has no handle for it): its two matrix
    products, q k^T and weights x v, as the explicit formula's matmuls count; the mask, scale and softmax,
    element-wise, are not counted."""
    from mmengine.analysis.jit_handles import get_shape
    q, k, v = (get_shape(t) for t in inputs[:3])
    batch = 1
    for side in q[:-2]:
        batch *= side
    return batch * q[-2] * k[-2] * (q[-1] + v[-1])


def count_flops(model, *inputs, depth=2):
    """FLOPs (2 per MAC) of one forward pass ``model(*inputs)`` and the per-module breakdown.

    Args:
        model: an nn.Module (put in eval mode by the caller if needed).
        inputs: positional inputs of ``forward``.
        depth: module depth of the breakdown.
    Returns:
        (total_flops, {module_name: flops}) with the names of ``named_modules`` up to ``depth`` levels
        (``'backbone'``, ``'backbone.block1'`` ...; ``''`` is the whole model).
    """
    from mmengine.analysis import FlopAnalyzer
    with torch.no_grad(), _counting_mode(model):
        analyzer = FlopAnalyzer(model, inputs)
        analyzer.set_op_handle('aten::scaled_dot_product_attention', sdpa_flop_jit)
        analyzer.unsupported_ops_warnings(False)
        analyzer.uncalled_modules_warnings(False)
        analyzer.tracer_warnings('none')
        total = analyzer.total()
        by_module = analyzer.by_module()
    per_module = {name: 2 * macs for name, macs in by_module.items()
                  if name == '' or name.count('.') < depth}
    return 2 * total, per_module


def _import_mmpola():
    """Register mmpola's models (the repository root is on sys.path: tools/_mmpola_tools.py)."""
    import mmpola  # noqa: F401


def build_backbone(type_name, arch=None, **kwargs):
    """Build a backbone from mmengine's MODELS registry.

    ``type_name`` is a registered type ('PolaPVT', 'PolaSwin') or a scoped one of another
    OpenMMLab library ('mmdet.SwinTransformer', 'mmdet.PyramidVisionTransformer').
    """
    _import_mmpola()
    from mmengine.registry import MODELS
    if '.' in type_name:
        scope = type_name.split('.', 1)[0]
        try:
            __import__(f'{scope}.models')
        except ImportError as err:
            raise RuntimeError(f'{type_name} needs the {scope} package, which cannot be imported ({err}); '
                               f'install it (see requirements/pins.txt)') from err
    cfg = dict(type=type_name, **kwargs)
    if arch is not None:
        cfg['arch'] = arch
    try:
        return MODELS.build(cfg)
    except KeyError as err:
        raise RuntimeError(f'{type_name!r} is not registered in mmengine\'s MODELS: {err}. Pola backbones are '
                           f"'PolaPVT' and 'PolaSwin'; other libraries' types need their scope, e.g. "
                           f"'mmdet.SwinTransformer'") from err


def _guess_scope(cfg):
    scope = cfg.get('default_scope')
    if scope:
        return scope
    model_type = str(cfg.model.get('type', ''))
    if model_type.startswith(('mmdet.', 'mmseg.')):
        return model_type.split('.', 1)[0]
    for scope in ('mmdet', 'mmseg'):
        try:
            registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
            __import__(f'{scope}.models')
        except ImportError:
            continue
        if registry.get(model_type) is not None:
            return scope
    raise RuntimeError(f'cannot tell whether model type {model_type!r} is an mmdet or mmseg model; '
                       f"set default_scope = 'mmdet' or 'mmseg' in the config")


def _data_samples(scope, height, width):
    meta = dict(img_shape=(height, width), ori_shape=(height, width), pad_shape=(height, width),
                batch_input_shape=(height, width), scale_factor=(1.0, 1.0), flip=False, flip_direction=None)
    if scope == 'mmdet':
        from mmdet.structures import DetDataSample
        return [DetDataSample(metainfo=meta)]
    if scope == 'mmseg':
        from mmseg.structures import SegDataSample
        return [SegDataSample(metainfo=meta)]
    return None


def build_from_config(config_path, height, width, cfg_options=None):
    """The model of an mmengine config, ready for :func:`count_flops` on a (1, 3, H, W) input.

    As mmdet's and mmseg's get_flops: the data preprocessor is skipped (the input already is a
    normalised, padded batch) and ``forward`` is bound to data samples of that size and
    ``mode='tensor'``. Returns ``(model, inputs)``.
    """
    _import_mmpola()
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    cfg = Config.fromfile(config_path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    scope = _guess_scope(cfg)
    init_default_scope(scope)
    registry = __import__(f'{scope}.registry', fromlist=['MODELS']).MODELS
    model_cfg = cfg.model.copy()
    # no pretrained weights: FLOPs do not depend on them and loading may need the network
    if 'backbone' in model_cfg:
        model_cfg.backbone.pop('init_cfg', None)
    model = registry.build(model_cfg)
    model.eval()
    model.forward = partial(model.forward, data_samples=_data_samples(scope, height, width), mode='tensor')
    return model, (torch.randn(1, 3, height, width), )


def _nested(options):
    """``{'attn.type': 'pola'}`` (DictAction's keys) -> ``{'attn': {'type': 'pola'}}``."""
    out = {}
    for key, value in options.items():
        *parents, leaf = key.split('.')
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def format_count(value, unit):
    return f'{value / 1e9:.3f} G{unit}' if value >= 1e8 else f'{value / 1e6:.3f} M{unit}'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument('--backbone',
                        help='registered backbone type, e.g. PolaPVT, PolaSwin, mmdet.SwinTransformer')
    source.add_argument('--config', nargs='+', help='mmengine config(s) of a detector or segmentor')
    parser.add_argument('--arch', default=None, help='backbone arch preset (tiny, small, ...)')
    parser.add_argument('--shape', type=int, nargs='+', default=[224, 224], help='input H W (or one size)')
    parser.add_argument('--per-module', type=int, default=0, metavar='DEPTH',
                        help='also print the FLOPs of modules up to this depth')
    parser.add_argument('--table', action='store_true',
                        help='one markdown row per config: | config | params | GMACs | (docs/model_zoo.md)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
                        help='override config entries (mmengine syntax, as tools/train.py), e.g. '
                        'model.backbone.arch=small model.backbone.out_indices="(1,2,3)"; with --backbone: '
                        'arguments of the backbone, e.g. attn.type=pola attn_type=LLSS')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if len(args.shape) == 1:
        height = width = args.shape[0]
    elif len(args.shape) == 2:
        height, width = args.shape
    else:
        raise SystemExit(f'--shape takes H W or one size, got {args.shape}')
    if args.backbone:
        torch.manual_seed(0)
        options = _nested(args.cfg_options or {})
        if args.arch is not None and 'arch' in options:
            raise SystemExit('pass the arch either as --arch or in --cfg-options, not both')
        model = build_backbone(args.backbone, options.pop('arch', args.arch), **options)
        model.eval()  # not chained: some backbones' train() override returns None (mmdet Swin)
        inputs = (torch.randn(1, 3, height, width), )
        described = ([f'arch={args.arch}'] if args.arch else []) + \
            [f'{k}={v}' for k, v in _nested(args.cfg_options or {}).items() if k != 'arch']
        title = f'{args.backbone}' + (f"({', '.join(described)})" if described else '')
        return report(model, inputs, title, args)
    results = []
    for config in args.config:
        torch.manual_seed(0)
        model, inputs = build_from_config(config, height, width, args.cfg_options)
        if args.table:
            flops, _ = count_flops(model, *inputs)
            params = count_parameters(model)
            print(f'| {table_name(config)} | {params / 1e6:.2f} M | {flops / 2e9:.1f} |', flush=True)
            results.append((params, flops))
        else:
            title = f'{os.path.basename(config)} ({type(model).__name__}, mode=tensor)'
            results.append(report(model, inputs, title, args))
    return results[0] if len(results) == 1 else results


def table_name(config):
    """The config's name as the model zoo writes it: the path below configs/<task>/, without .py."""
    parts = os.path.normpath(os.path.abspath(config)).split(os.sep)
    below = parts[parts.index('configs') + 2:] if 'configs' in parts else parts[-1:]
    return '/'.join(below)[:-3]


def report(model, inputs, title, args):
    """Print the parameters and MACs of ``model(*inputs)`` (and the per-module breakdown)."""
    height, width = inputs[0].shape[-2:]
    flops, per_module = count_flops(model, *inputs, depth=max(1, args.per_module))
    params = count_parameters(model)
    print(f'model:   {title}')
    print(f'input:   (1, 3, {height}, {width})')
    print(f'params:  {params / 1e6:.2f} M ({params:,})')
    print(f'MACs:    {format_count(flops / 2, "MACs")}  (FLOPs: {format_count(flops, "FLOPs")})')
    print(f'         {MAC_CONVENTION}')
    if args.per_module:
        print('\n| module | GMACs | share |\n|---|---:|---:|')
        for name, value in per_module.items():
            if name and value:
                print(f'| {name} | {value / 2e9:.4f} | {100 * value / max(flops, 1):.1f}% |')
    return params, flops
    return params, flops


if __name__ == '__main__':
    main()
