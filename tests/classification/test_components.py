"""Dataset, transforms, data preprocessor, model wrapper, metric and EMA switch."""
import os.path as osp

import pytest
import torch
from mmengine.registry import DATASETS, HOOKS, METRICS, MODELS, TRANSFORMS
from PIL import Image

from mmpola.classification import (
    ClassificationModel,
    ImageNetFolderDataset,
    SwitchableEMAHook,
    TimmClsDataPreprocessor,
    TopKAccuracy,
)
from mmpola.classification.demo_imagenet import DEMO_CLASSES

TINY_ARCH = dict(embed_dims=[8, 16, 24, 32], num_heads=[1, 2, 3, 4], mlp_ratios=[2, 2, 2, 2],
                 depths=[1, 1, 1, 1])
EVAL_PIPELINE = [
    dict(type='LoadPILImage'),
    dict(type='TimmTransform', input_size=224, is_training=False, crop_pct=224 / 256,
         crop_mode='squash', interpolation='bicubic'),
    dict(type='PackClsInputs'),
]


def _dataset(root, split='val', pipeline=EVAL_PIPELINE, **kwargs):
    return DATASETS.build(dict(type='ImageNetFolderDataset', data_root=root,
                               data_prefix=dict(img_path=split), pipeline=pipeline, **kwargs))


def test_dataset_folder_layout(tiny_imagenet, tmp_path):
    train = _dataset(tiny_imagenet, 'train')
    assert isinstance(train, ImageNetFolderDataset)
    assert train.metainfo['classes'] == tuple(sorted(DEMO_CLASSES))
    assert len(train) == 24
    labels = train.get_gt_labels()
    assert sorted(set(labels)) == list(range(6))
    info = train.get_data_info(0)
    assert osp.basename(osp.dirname(info['img_path'])) == train.metainfo['classes'][info['gt_label']]
    sample = train[0]
    assert sample['inputs'].dtype == torch.uint8 and sample['inputs'].shape == (3, 224, 224)
    assert sample['data_samples']['gt_label'] == labels[0]

    # a fixed class list keeps the indices when a split lacks classes
    classes = ('zebra',) + tuple(sorted(DEMO_CLASSES))
    val = _dataset(tiny_imagenet, 'val', metainfo=dict(classes=classes))
    assert min(val.get_gt_labels()) == 1
    with pytest.raises(ValueError, match='missing from metainfo.classes'):
        _dataset(tiny_imagenet, 'val', metainfo=dict(classes=('circle',)))
    with pytest.raises(FileNotFoundError, match='ImageNet layout'):
        _dataset(str(tmp_path), 'val')


def test_eval_transform_is_the_official_one(tiny_imagenet):
    """TimmTransform + TimmClsDataPreprocessor == torchvision Resize((256, 256), bicubic),
    CenterCrop(224), ToTensor, Normalize (official data/build.py)."""
    from torchvision import transforms as T
    dataset = _dataset(tiny_imagenet, 'val')
    preprocessor = TimmClsDataPreprocessor()
    official = T.Compose([T.Resize((256, 256), interpolation=T.InterpolationMode.BICUBIC),
                          T.CenterCrop(224), T.ToTensor(),
                          T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    sample = dataset[3]
    ours = preprocessor(dict(inputs=[sample['inputs']], data_samples=[sample['data_samples']]))
    with Image.open(dataset.get_data_info(3)['img_path']) as img:
        ref = official(img.convert('RGB'))
    assert (ours['inputs'][0] - ref).abs().max() < 1e-5
    assert ours['data_samples']['gt_label'].tolist() == [sample['data_samples']['gt_label']]


def test_training_transform_and_argument_checks(tiny_imagenet):
    pipeline = [dict(type='LoadPILImage'),
                dict(type='TimmTransform', input_size=64, is_training=True, color_jitter=0.4,
                     auto_augment='rand-m9-mstd0.5-inc1', interpolation='bicubic'),
                dict(type='PackClsInputs')]
    sample = _dataset(tiny_imagenet, 'train', pipeline)[0]
    assert sample['inputs'].shape == (3, 64, 64) and sample['inputs'].dtype == torch.uint8
    with pytest.raises(ValueError, match='data preprocessor'):
        TRANSFORMS.build(dict(type='TimmTransform', input_size=224, is_training=True, re_prob=0.25))
    with pytest.raises(ValueError, match='fixed'):
        TRANSFORMS.build(dict(type='TimmTransform', input_size=224, mean=(0.5, 0.5, 0.5)))


def test_high_bit_depth_images_keep_their_picture(tmp_path):
    """A 16-bit grey PNG: its top 8 bits, as OpenCV (the detection and segmentation loaders) reads it; PIL's
    convert('RGB') made it all white. A float image, which has no 8-bit scale, is refused naming the file."""
    import mmcv
    import numpy as np
    from PIL import Image

    from mmpola.datasets.decoding import UnreadableImageError
    values = np.linspace(19532, 48830, 48 * 64).reshape(48, 64).astype(np.uint16)
    Image.fromarray(values).save(tmp_path / 'grey16.png')
    image = np.asarray(TRANSFORMS.build(dict(type='LoadPILImage'))(dict(img_path=str(tmp_path / 'grey16.png')))['img'])
    assert image.shape == (48, 64, 3) and (image.min(), image.max()) == (76, 190)
    assert np.array_equal(image, mmcv.imread(str(tmp_path / 'grey16.png')))
    Image.fromarray(values.astype(np.float32)).save(tmp_path / 'float.tif')
    with pytest.raises(UnreadableImageError, match=r'float.tif cannot be loaded \(ValueError: a 32-bit float image'):
        TRANSFORMS.build(dict(type='LoadPILImage'))(dict(img_path=str(tmp_path / 'float.tif')))


def test_preprocessor_mixup_and_erasing():
    torch.manual_seed(0)
    preprocessor = MODELS.build(dict(
        type='TimmClsDataPreprocessor', random_erasing=dict(probability=1.0, mode='pixel'),
        mixup=dict(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=5)))
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    data = dict(inputs=images, data_samples=dict(gt_label=torch.tensor([0, 1, 2, 3])))
    evaluated = preprocessor(data, training=False)
    assert 'gt_score' not in evaluated['data_samples']
    mean = torch.tensor([123.675, 116.28, 103.53]).view(1, 3, 1, 1)
    std = torch.tensor([58.395, 57.12, 57.375]).view(1, 3, 1, 1)
    assert torch.allclose(evaluated['inputs'], (images.float() - mean) / std)
    trained = preprocessor(data, training=True)
    scores = trained['data_samples']['gt_score']
    assert scores.shape == (4, 5)
    assert torch.allclose(scores.sum(1), torch.ones(4))
    assert not torch.allclose(trained['inputs'], evaluated['inputs'])
    with pytest.raises(ValueError, match='even batch size'):
        preprocessor(dict(inputs=images[:3], data_samples=dict(gt_label=torch.tensor([0, 1, 2]))),
                     training=True)


def test_model_loss_predict_and_state_dict_names():
    model = MODELS.build(dict(type='ClassificationModel', family='pvt', arch=TINY_ARCH, num_classes=5,
                              pretrain_img_size=64, drop_path_rate=0.0,
                              data_preprocessor=dict(type='TimmClsDataPreprocessor')))
    assert isinstance(model, ClassificationModel)
    assert isinstance(model.data_preprocessor, TimmClsDataPreprocessor)
    keys = list(model.state_dict())
    assert all(k.split('.')[0] in ('backbone', 'norm', 'head') for k in keys), keys[:5]
    assert 'backbone.block1.0.attn.qg.weight' in keys

    x = torch.randn(4, 3, 64, 64)
    labels = torch.tensor([0, 1, 2, 3])
    hard = model(x, dict(gt_label=labels), mode='loss')['loss']
    plain = torch.nn.functional.cross_entropy(model(x), labels, label_smoothing=0.1)
    assert torch.allclose(hard, plain)
    soft_targets = torch.full((4, 5), 0.2)
    soft = model(x, dict(gt_label=labels, gt_score=soft_targets), mode='loss')['loss']
    assert torch.allclose(soft, -(soft_targets * model(x).log_softmax(-1)).sum(-1).mean())

    model.eval()
    with torch.no_grad():
        results = model(x, dict(gt_label=labels, img_path=['a', 'b', 'c', 'd']), mode='predict')
    assert len(results) == 4 and results[2]['img_path'] == 'c'
    assert torch.allclose(results[0]['pred_score'].sum(), torch.tensor(1.0))
    assert int(results[0]['pred_label']) == int(results[0]['pred_score'].argmax())
    with pytest.raises(ValueError, match='mode'):
        model(x, mode='features')


def test_topk_accuracy():
    metric = METRICS.build(dict(type='TopKAccuracy', topk=(1, 2, 5)))
    assert isinstance(metric, TopKAccuracy)
    scores = torch.tensor([[0.6, 0.3, 0.1], [0.1, 0.2, 0.7], [0.5, 0.4, 0.1], [0.2, 0.3, 0.5]])
    labels = [0, 1, 1, 0]
    metric.process({}, [dict(pred_score=s, gt_label=torch.tensor(label)) for s, label in zip(scores, labels)])
    result = metric.evaluate(4)
    # sample 0: top1; 1: rank 2; 2: rank 2; 3: rank 3 -> top1 1/4, top2 3/4, top5 (>= 3 classes) 4/4
    assert result == {'accuracy/top1': 25.0, 'accuracy/top2': 75.0, 'accuracy/top5': 100.0}


def test_switchable_ema_hook_does_nothing_unless_enabled():
    class Runner:
        model = torch.nn.Linear(2, 2)

    hook = HOOKS.build(dict(type='SwitchableEMAHook', momentum=0.5))
    assert isinstance(hook, SwitchableEMAHook) and not hook.enabled
    hook.before_run(Runner)
    assert not hasattr(hook, 'ema_model')
    hook.before_save_checkpoint(Runner, {})
    enabled = HOOKS.build(dict(type='SwitchableEMAHook', enabled=True, momentum=0.5))
    enabled.before_run(Runner)
    assert hasattr(enabled, 'ema_model')


def test_demo_data_is_deterministic(tmp_path):
    import hashlib

    from mmpola.classification.demo_imagenet import demo_imagenet_is_complete, make_demo_imagenet

    def digest(root):
        files = sorted(p for p in root.rglob('*.JPEG'))
        return [hashlib.md5(p.read_bytes()).hexdigest() for p in files]

    meta = make_demo_imagenet(str(tmp_path / 'a'), num_train=2, num_val=1, seed=3)
    make_demo_imagenet(str(tmp_path / 'b'), num_train=3, num_val=1, seed=3)
    assert demo_imagenet_is_complete(str(tmp_path / 'a'))
    assert meta['images'] == {'train': 12, 'val': 6} and tuple(meta['classes']) == DEMO_CLASSES
    a, b = digest(tmp_path / 'a' / 'val'), digest(tmp_path / 'b' / 'val')
    assert a == b  # per-image seeds: independent of how many images a split gets
    make_demo_imagenet(str(tmp_path / 'c'), num_train=2, num_val=1, seed=4)
    assert digest(tmp_path / 'c' / 'val') != a


def test_demo_config_builds():
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))),
                                   'configs', 'demo', 'pola-pvt_demo-imagenet-64x64.py'))
    assert cfg.data_preprocessor.mixup is None and cfg.data_preprocessor.random_erasing is None
    assert cfg.train_dataloader.dataset.metainfo.classes == DEMO_CLASSES
    model = MODELS.build(cfg.model)
    assert model.head.out_features == 6
    assert 1.4e6 < sum(p.numel() for p in model.parameters()) < 1.6e6
