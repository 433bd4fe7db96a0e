"""mmpola's registries.

The backbones, classifiers, hooks, transforms, metrics, the optimizer wrapper and its constructor register in the
``mmpola``-scope registries below, each a child of mmengine's root registry of its kind; a registration there is
made in the root registry too (:class:`ScopedRegistry`). So configs find them by their plain names (``type='PolaPVT'``)
from every library's default scope (mmdet, mmseg, mmpretrain look in their registry, then the root),
and by the scoped name (``type='mmpola.SafeCheckpointHook'``) from every scope, mmpola's own included:
mmengine gives the dicts of a config inherited through ``mmpola::`` the scope ``mmpola``, and looks a
scoped name up in that scope's registry only. The import location of the registries is the package
itself, so that mmengine, which knows ``mmpola`` as a package with configs (:mod:`mmpola.config_scope`),
imports it instead of looking for an ``mmpola.utils.register_all_modules``.

``ATTENTIONS`` holds the attention modules a backbone stage can use, under short names
(``'pola'``, ``'softmax'`` ...; mmpola.models.attention), and ``ARCHITECTURES`` the macro
architectures under their family names (``'pvt'``, ``'swin'``, ``'polapp'``; the same classes are in
``MODELS`` under their class names), and ``CLASSIFICATION_HEADS`` each architecture's official
ImageNet head under the same family names; the three are mmpola's own.
"""
from mmengine.registry import DATA_SAMPLERS as MMENGINE_DATA_SAMPLERS
from mmengine.registry import DATASETS as MMENGINE_DATASETS
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import METRICS as MMENGINE_METRICS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS as MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS
from mmengine.registry import OPTIM_WRAPPERS as MMENGINE_OPTIM_WRAPPERS
from mmengine.registry import TRANSFORMS as MMENGINE_TRANSFORMS
from mmengine.registry import Registry

__all__ = ['ScopedRegistry', 'MODELS', 'HOOKS', 'TRANSFORMS', 'METRICS', 'DATASETS', 'DATA_SAMPLERS', 'OPTIM_WRAPPERS',
           'OPTIM_WRAPPER_CONSTRUCTORS', 'ATTENTIONS', 'ARCHITECTURES', 'CLASSIFICATION_HEADS']


class ScopedRegistry(Registry):
    """A registry of the ``mmpola`` scope whose registrations are made in its parent, mmengine's root
    registry, as well (see the module docstring)."""

    def _register_module(self, module, module_name=None, force=False):
        super()._register_module(module, module_name, force)
        self.parent._register_module(module, module_name, force)


MODELS = ScopedRegistry('model', parent=MMENGINE_MODELS, scope='mmpola', locations=['mmpola'])
HOOKS = ScopedRegistry('hook', parent=MMENGINE_HOOKS, scope='mmpola', locations=['mmpola'])
TRANSFORMS = ScopedRegistry('transform', parent=MMENGINE_TRANSFORMS, scope='mmpola', locations=['mmpola'])
METRICS = ScopedRegistry('metric', parent=MMENGINE_METRICS, scope='mmpola', locations=['mmpola'])
DATASETS = ScopedRegistry('dataset', parent=MMENGINE_DATASETS, scope='mmpola', locations=['mmpola'])
DATA_SAMPLERS = ScopedRegistry('data sampler', parent=MMENGINE_DATA_SAMPLERS, scope='mmpola', locations=['mmpola'])
OPTIM_WRAPPERS = ScopedRegistry('optim_wrapper', parent=MMENGINE_OPTIM_WRAPPERS, scope='mmpola', locations=['mmpola'])
OPTIM_WRAPPER_CONSTRUCTORS = ScopedRegistry('optimizer wrapper constructor', parent=MMENGINE_OPTIM_WRAPPER_CONSTRUCTORS,
                                            scope='mmpola', locations=['mmpola'])

# attention modules of the backbone stages, by short name; see mmpola.models.attention
ATTENTIONS = Registry('attention', scope='mmpola', locations=['mmpola'])
# macro architectures (dense backbones) by family name; see mmpola.models.backbones
ARCHITECTURES = Registry('architecture', scope='mmpola', locations=['mmpola'])
# the official ImageNet head of each architecture, by family name; see mmpola.models.classification_head
CLASSIFICATION_HEADS = Registry('classification head', scope='mmpola', locations=['mmpola'])
