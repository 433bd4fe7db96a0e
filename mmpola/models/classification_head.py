"""The official ImageNet head of each architecture: what :class:`~mmpola.models.classifier.ImageClassifier`
puts after a backbone.

A head is a set of settings and hooks, not a module: the modules it builds (``norm``, ``head``;
PolaFormer++ ``proj``, ``norm``, ``head``) become the classifier's own children, beside ``backbone``,
so the classifier's state dict keeps the official names (``backbone.<official names>``, ``norm.*``,
``head.*``) and official files load by filtering. Each architecture's head lives in the architecture's
module (pvt.py, swin.py, ...) and is registered under the architecture's family name::

    @register_classification_head('swin')
    class SwinHead(FinalNormHead):                                 # a final LayerNorm
        backbone_kwargs = dict(out_norm=False, clamp_shift=True)   # fixed by the official forward

:class:`ClassificationHead` itself is PVT's head (no final norm, mean over the tokens, a linear
``head``), the default of every hook; an architecture without a registered head gets it.
:class:`FinalNormHead` adds a final LayerNorm (Swin, CSWin, the ViT).
"""
import torch.nn as nn

from mmpola.registry import CLASSIFICATION_HEADS

from .layers import trunc_normal_init

__all__ = ['ClassificationHead', 'FinalNormHead', 'register_classification_head', 'classification_head_of']


def register_classification_head(family):
    """Class decorator: the head of architecture ``family`` (in
    :data:`mmpola.registry.CLASSIFICATION_HEADS`, next to the architecture's own registration)."""
    def register(cls):
        cls.family = family
        CLASSIFICATION_HEADS.register_module(name=family, module=cls)
        return cls

    return register


def classification_head_of(family):
    """The head class of architecture ``family`` (:class:`ClassificationHead` when none is registered)."""
    return CLASSIFICATION_HEADS.get(family) if family in CLASSIFICATION_HEADS.module_dict else ClassificationHead


class ClassificationHead:
    """The official classification head of an architecture (defaults: PVT's).

    Attributes:
        family: the architecture (set by :func:`register_classification_head`).
        backbone_kwargs: backbone arguments the official classification forward fixes.
        modules: the classifier's modules beside ``backbone`` (unprefixed in official files, which a
            dense backbone's filter drops).
        args: classifier arguments of the head (PolaFormer++: ``projection``).
        global_pools: the classifier's ``global_pool`` values, the official first.
    """

    family = None
    backbone_kwargs = {}
    modules = ('norm', 'head')
    args = ()
    global_pools = ('avg', '')

    @classmethod
    def neck(cls, backbone, **args):
        """``({name: module}, num_features)``: the modules between the last stage and the pooling, and
        the width of the pooled features. Default: no final norm."""
        return {'norm': nn.Identity()}, backbone.embed_dims[-1]

    @classmethod
    def features(cls, backbone, neck, stage):
        """The last ``forward_stages`` entry -> the final map (B, h, w, num_features), NHWC; ``neck``:
        the classifier holding the modules of :meth:`neck`."""
        tokens, hw = stage
        tokens = neck.norm(tokens)
        return tokens.reshape(tokens.shape[0], hw[0], hw[1], tokens.shape[-1])

    @classmethod
    def pool_size(cls, architecture, img_size):
        """The (h, w) of :meth:`features` at ``img_size`` (timm's ``pool_size``): stride 32."""
        return img_size // 32, img_size // 32

    @classmethod
    def stage_norm(cls, neck):
        """The norm ``forward_intermediates(norm=True)`` applies to the last stage map, or None."""
        return None

    @classmethod
    def pool(cls, backbone, x, global_pool='avg'):
        """The official pooling (``global_pool``: one of ``global_pools`` but ''): final map
        (B, h, w, F) -> (B, F). Default: mean over the tokens."""
        return x.flatten(1, 2).mean(dim=1)

    @classmethod
    def build_head(cls, backbone, num_features, num_classes):
        """The official head: ``nn.Linear`` (trunc-normal .02, zero bias), ``nn.Identity`` for 0 classes."""
        if num_classes <= 0:
            return nn.Identity()
        head = nn.Linear(num_features, num_classes)
        trunc_normal_init(head)
        return head

    @classmethod
    def logits(cls, head, x, pooled):
        """Apply the head to pooled (B, F) or, unpooled, to (B, h, w, F) features."""
        return head(x)

    @classmethod
    def official_kwargs(cls, architecture, kwargs):
        """Keyword arguments of the official model class -> ``(classifier kwargs, the rest (the
        attention's options), the official attn_type string or None)``, or None when they are not
        this architecture's (``architecture``: its backbone class)."""
        return None


class FinalNormHead(ClassificationHead):
    """A head with a final LayerNorm ``norm`` over the last stage's width (Swin, CSWin, the ViT), which
    ``forward_intermediates(norm=True)`` applies to the last stage map too; ``norm_eps``: its eps."""

    norm_eps = 1e-5

    @classmethod
    def neck(cls, backbone):
        return {'norm': nn.LayerNorm(backbone.embed_dims[-1], eps=cls.norm_eps)}, backbone.embed_dims[-1]

    @classmethod
    def stage_norm(cls, neck):
        return neck.norm
