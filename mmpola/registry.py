"""mmpola's registries.

The backbones, classifiers, hooks, transforms and metrics register in mmengine's root registries,
so that mmdet, mmseg and mmpretrain configs find them by their plain names (``type='PolaPVT'``)
from their own default scope. The child registries below give them the ``mmpola`` scope as well
(``type='mmpola.PolaPVT'`` resolves from any scope: a scoped name is looked up in the child of that
scope, which falls back on its parent, the root). Their import location is the package itself, so that
mmengine, which knows ``mmpola`` as a package with configs (:mod:`mmpola.config_scope`), imports it
instead of looking for an ``mmpola.utils.register_all_modules``.

``ATTENTIONS`` holds the attention modules a backbone stage can use, under short names
(``'pola'``, ``'softmax'`` ...; mmpola.models.attention), and ``ARCHITECTURES`` the macro
architectures under their family names (``'pvt'``, ``'swin'``, ``'polapp'``; the same classes are in
``MODELS`` under their class names); both are mmpola's own.
"""
from mmengine.registry import DATA_SAMPLERS as MMENGINE_DATA_SAMPLERS
from mmengine.registry import DATASETS as MMENGINE_DATASETS
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import METRICS as MMENGINE_METRICS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import OPTIM_WRAPPERS as MMENGINE_OPTIM_WRAPPERS
from mmengine.registry import TRANSFORMS as MMENGINE_TRANSFORMS
from mmengine.registry import Registry

__all__ = ['MODELS', 'HOOKS', 'TRANSFORMS', 'METRICS', 'DATASETS', 'DATA_SAMPLERS', 'OPTIM_WRAPPERS',
           'ATTENTIONS', 'ARCHITECTURES']

MODELS = Registry('model', parent=MMENGINE_MODELS, scope='mmpola', locations=['mmpola'])
HOOKS = Registry('hook', parent=MMENGINE_HOOKS, scope='mmpola', locations=['mmpola'])
TRANSFORMS = Registry('transform', parent=MMENGINE_TRANSFORMS, scope='mmpola', locations=['mmpola'])
METRICS = Registry('metric', parent=MMENGINE_METRICS, scope='mmpola', locations=['mmpola'])
DATASETS = Registry('dataset', parent=MMENGINE_DATASETS, scope='mmpola', locations=['mmpola'])
DATA_SAMPLERS = Registry('data sampler', parent=MMENGINE_DATA_SAMPLERS, scope='mmpola', locations=['mmpola'])
OPTIM_WRAPPERS = Registry('optim_wrapper', parent=MMENGINE_OPTIM_WRAPPERS, scope='mmpola', locations=['mmpola'])

# attention modules of the backbone stages, by short name; see mmpola.models.attention
ATTENTIONS = Registry('attention', scope='mmpola', locations=['mmpola'])
# macro architectures (dense backbones) by family name; see mmpola.models.backbones
ARCHITECTURES = Registry('architecture', scope='mmpola', locations=['mmpola'])
