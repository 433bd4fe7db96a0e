"""The ImageNet classifier as an mmengine model (what tools/train.py and tools/test.py run)."""
import torch.nn.functional as F
from mmengine.model import BaseModel
from timm.loss import SoftTargetCrossEntropy

from mmpola.models.classifier import ImageClassifier
from mmpola.registry import MODELS

__all__ = ['ClassificationModel']


@MODELS.register_module()
class ClassificationModel(ImageClassifier, BaseModel):
    """:class:`~mmpola.models.classifier.ImageClassifier` with mmengine's model interface: data
    preprocessor, loss (hard or Mixup/CutMix soft targets), predictions.

    It *is* the classifier (subclass, no wrapper prefix), so the checkpoints it saves hold
    ``backbone.<official names>`` and the head's modules (``norm.*`` (Swin), ``head.*``; PolaFormer++
    ``proj.*``, ``norm.*``, ``head.*``): every detection / segmentation config loads them through
    ``init_cfg=dict(type='Pretrained', checkpoint=...)`` as they are, and
    ``timm.create_model('pola_*', checkpoint_path=...)`` too. Official PolaFormer, FLatten, InLine and
    PolaFormer++ files load into it as well (``load_from``, ``tools/test.py CONFIG OFFICIAL.pth``,
    ``init_cfg=dict(type='Pretrained', ...)``).

    Args:
        data_preprocessor: config of :class:`TimmClsDataPreprocessor` (or any mmengine data
            preprocessor).
        label_smoothing: smoothing of the cross-entropy with hard labels (official 0.1). With
            Mixup/CutMix in the data preprocessor the targets arrive as soft scores
            (``data_samples['gt_score']``, smoothing already applied by timm's Mixup) and the
            loss is timm's ``SoftTargetCrossEntropy``, as in the official training.
        **kwargs: :class:`~mmpola.models.classifier.ImageClassifier` arguments (``family``, ``arch``,
            ``kind``, ``num_classes``, ``drop_path_rate``, ``with_cp``, ``init_cfg``; PolaFormer++
            ``projection`` ...).

    ``forward(inputs, data_samples, mode)``: ``'tensor'`` -> logits (B, num_classes);
    ``'loss'`` -> ``dict(loss=...)``; ``'predict'`` -> one dict per image with ``pred_score``
    (softmax, (num_classes,)), ``pred_label`` and the sample's ``gt_label`` / ``img_path``.
    """

    def __init__(self, data_preprocessor=None, label_smoothing=0.1, **kwargs):
        # ImageClassifier.__init__ reaches BaseModel.__init__ through super() (MRO), which
        # installs a default preprocessor; the configured one replaces it.
        super().__init__(**kwargs)
        if data_preprocessor is not None:
            if isinstance(data_preprocessor, dict):
                data_preprocessor = MODELS.build(data_preprocessor)
            self.data_preprocessor = data_preprocessor
        self.label_smoothing = label_smoothing
        self._soft_target_loss = SoftTargetCrossEntropy()

    def forward(self, inputs, data_samples=None, mode='tensor'):
        if mode == 'tensor':
            return self.forward_head(self.forward_features(inputs))
        if mode == 'loss':
            return self.loss(inputs, data_samples)
        if mode == 'predict':
            return self.predict(inputs, data_samples)
        raise ValueError(f"mode must be 'tensor', 'loss' or 'predict', got {mode!r}")

    def loss(self, inputs, data_samples):
        logits = self.forward_head(self.forward_features(inputs))
        scores = data_samples.get('gt_score')
        if scores is not None:
            loss = self._soft_target_loss(logits.float(), scores)
        else:
            loss = F.cross_entropy(logits.float(), data_samples['gt_label'],
                                   label_smoothing=self.label_smoothing)
        return dict(loss=loss)

    def predict(self, inputs, data_samples=None):
        scores = F.softmax(self.forward_head(self.forward_features(inputs)).float(), dim=-1)
        labels = scores.argmax(dim=-1)
        results = []
        for i in range(scores.shape[0]):
            result = dict(pred_score=scores[i], pred_label=labels[i])
            if data_samples is not None:
                for key, value in data_samples.items():
                    if key != 'gt_score':
                        result[key] = value[i]
            results.append(result)
        return results
