"""Top-k accuracy (ImageNet top-1 / top-5) as an mmengine metric."""
import torch
from mmengine.evaluator import BaseMetric

from mmpola.registry import METRICS

__all__ = ['TopKAccuracy']


@METRICS.register_module()
class TopKAccuracy(BaseMetric):
    """Percentage of images whose label is among the ``k`` highest scores.

    Reads ``pred_score`` (num_classes,) and ``gt_label`` from each prediction of
    :class:`ClassificationModel`. Only one boolean per image and k is kept, so evaluating
    50k ImageNet images across processes moves almost nothing. Reported as
    ``accuracy/top{k}`` (mmpretrain's names); a k above the number of classes counts every
    image as correct.

    Args:
        topk: the k values.
        collect_device, prefix: see :class:`mmengine.evaluator.BaseMetric`.
    """

    default_prefix = 'accuracy'

    def __init__(self, topk=(1, 5), collect_device='cpu', prefix=None):
        super().__init__(collect_device=collect_device, prefix=prefix)
        self.topk = (topk,) if isinstance(topk, int) else tuple(topk)

    def process(self, data_batch, data_samples):
        if not data_samples:
            return
        scores = torch.stack([s['pred_score'] for s in data_samples]).float().cpu()
        labels = torch.as_tensor([int(s['gt_label']) for s in data_samples])
        maxk = min(max(self.topk), scores.shape[1])
        ranked = scores.topk(maxk, dim=1).indices
        hits = ranked == labels[:, None]
        for row in hits:
            self.results.append({k: bool(row[:k].any()) for k in self.topk})

    def compute_metrics(self, results):
        return {f'top{k}': 100.0 * sum(r[k] for r in results) / max(len(results), 1)
                for k in self.topk}
