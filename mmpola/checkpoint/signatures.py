"""Is this file for this model? Decided once, by comparing key signatures.

A *key pattern* is a state-dict key with its numbers replaced by ``#`` (``block#.#.attn.qg.weight``),
so models of one architecture share patterns whatever their depth. A model's
:class:`KeySignature` holds the patterns of its keys outside the attention modules (its
*structure*) and, per attention kind, the parameter names of one of its modules below the module
(its *leaves*: ``qg.weight``, ``power`` ...; biases, the optional spatial reduction ``sr.*`` /
``norm.*`` and run-time buffers left out).

:meth:`KeySignature.check` refuses a file

* whose keys cover less than half of the model's structure or hold none of its attention modules
  (another architecture: a Pola-Swin file for a PVT), or whose keys miss some of the model's
  structure that a known model of another architecture has all of (a PVTv2 file for a PVT-v1: the two
  share most names), or
* that has no attention module with the leaves of one of the model's kinds (another attention kind
  of the same architecture: a Pola-PVT file for a FLatten-PVT, a softmax PVT file for a Pola-PVT),

with an error that says what the file looks like (:func:`identify`) and how to use it.

What files look like is known from the models the package registers (:func:`register_known_models`:
every architecture with every attention kind, computed by mmpola.models), plus look-alikes of other
libraries (mmdet's PVT and Swin). :func:`describe_checkpoint` uses the same knowledge for the
tools' messages.
"""
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, List, Optional

import torch

from .state_dict import CheckpointMismatchError, extract_state_dict

__all__ = ['key_pattern', 'KeySignature', 'KnownModel', 'LookAlike', 'register_known_models', 'known_models',
           'identify', 'attention_modules', 'leaf_signature', 'describe_checkpoint', 'describe_backbone']

# an attention module's prefix: '<...>.attn.' (PVT, Swin, the ViT, PolaFormer++) or one of CSWin's
# branches '<...>.attns.<b>.'; the last one in a key
ATTENTION = re.compile(r'^(.*\.(?:attn|attns\.\d+)\.)(.*)$')
# leaves an attention kind may or may not have (spatial reduction, recomputed buffers): not in a signature
OPTIONAL_LEAVES = ('sr.', 'norm.')
RUNTIME_BUFFERS = ('attn_mask', 'relative_position_index')
MIN_STRUCTURE = 0.5  # share of the model's structure patterns a file of it has


def key_pattern(key):
    """``'block1.0.attn.qg.weight'`` -> ``'block#.#.attn.qg.weight'``."""
    return re.sub(r'\d+', '#', str(key))


def attention_modules(keys):
    """``{module prefix ('...attn.', CSWin's '...attns.<b>.'): [leaf names]}`` of every attention module
    in ``keys``."""
    out: Dict[str, list] = {}
    for key in keys:
        match = ATTENTION.match(str(key))
        if match:
            out.setdefault(match.group(1), []).append(match.group(2))
    return out


def leaf_signature(leaves):
    """The leaves that tell a kind: without biases (``qkv_bias=False`` changes them, not the kind),
    the optional spatial reduction and run-time buffers."""
    return frozenset(leaf for leaf in leaves
                     if not leaf.startswith(OPTIONAL_LEAVES) and not leaf.endswith('.bias')
                     and leaf not in RUNTIME_BUFFERS)


def _ends_with(pattern, suffix):
    return pattern == suffix or pattern.endswith('.' + suffix)


@dataclass(frozen=True)
class KnownModel:
    """A model of the package: an architecture with an attention kind.

    Attributes:
        name: what a file of it is called in messages (``'Pola-PVT (type="PolaPVT")'``).
        official: its name as a checkpoint (``'Pola-PVT'``).
        release: its short name in :func:`describe_checkpoint` (``'PolaFormer PVT'``).
        family, kind: the architecture (``'pvt'``) and the kind (``'pola'``).
        structure: its key patterns outside the attention modules.
        attention_prefix: the pattern of its attention modules' prefix (``'block#.#.attn.'``).
        leaves: the kind's :func:`leaf_signature` in this architecture.
        softmax: the kind is the architecture's softmax.
        released: a registered preset (released weights exist); preferred when a file fits several.
        fix: how to build a model for such a file (``"build type='PolaPVT'"``).
    """
    name: str
    official: str
    release: str
    family: str
    kind: str
    structure: FrozenSet[str]
    attention_prefix: str
    leaves: FrozenSet[str]
    softmax: bool = False
    released: bool = False
    fix: str = ''


@dataclass(frozen=True)
class LookAlike:
    """A file of another library whose keys look like ours (``description``, a regex on its keys)."""
    description: str
    pattern: str


_PROVIDERS: List[Callable] = []


def register_known_models(provider):
    """Register ``provider()``, which returns :class:`KnownModel` and :class:`LookAlike` entries
    (mmpola.models registers every architecture with every attention kind)."""
    _PROVIDERS.append(provider)
    return provider


def known_models():
    """Every registered :class:`KnownModel` and :class:`LookAlike`."""
    return [entry for provider in _PROVIDERS for entry in provider()]


@dataclass(frozen=True)
class Identification:
    """What a file looks like: the best :class:`KnownModel` (or a :class:`LookAlike`), the share of its
    structure the file covers, and every known model whose attention modules are in the file."""
    model: Optional[KnownModel] = None
    look_alike: Optional[LookAlike] = None
    kinds: tuple = ()
    structure: float = 0.0

    @property
    def name(self):
        if self.model is not None:
            return self.model.name
        return self.look_alike.description if self.look_alike is not None else None


def identify(keys):
    """What the file with these keys (any prefix) looks like (:class:`Identification`)."""
    keys = [str(k) for k in keys]
    patterns = {key_pattern(k) for k in keys}
    groups = [(key_pattern(prefix), leaf_signature(leaves)) for prefix, leaves in attention_modules(keys).items()]
    scored, exact = [], []
    for entry in known_models():
        if not isinstance(entry, KnownModel):
            continue
        match = 0.0
        for prefix, leaves in groups:
            if leaves and _ends_with(prefix, entry.attention_prefix) and leaves <= entry.leaves:
                match = max(match, len(leaves) / len(entry.leaves))
        if match == 1.0:
            exact.append(entry)
        covered = sum(1 for s in entry.structure if any(_ends_with(p, s) for p in patterns))
        structure = covered / max(len(entry.structure), 1)
        if match or structure >= MIN_STRUCTURE:
            scored.append(((structure >= MIN_STRUCTURE, match, not entry.softmax, structure, entry.released), entry))
    if scored:
        score, best = max(scored, key=lambda item: item[0])
        same_arch = tuple(e for e in exact if e.family == best.family)
        return Identification(model=best, kinds=same_arch, structure=score[3])
    joined = '\n'.join(keys)
    for entry in known_models():
        if isinstance(entry, LookAlike) and re.search(entry.pattern, joined, re.M):
            return Identification(look_alike=entry)
    return Identification()


@dataclass(frozen=True)
class KeySignature:
    """The key signature of a model (see the module docstring).

    Attributes:
        name: the model's class name, for messages.
        hint: a key every file of it has (``'block1.*'``), for messages.
        structure: key patterns outside the attention modules (dense-only modules excluded).
        attention_prefixes: patterns of its attention modules' prefixes.
        kinds: ``{kind: leaf signature}`` of its attention kinds.
        examples: ``{kind: a full key of one of its modules}``.
        titles: ``{kind: name in messages}``.
        family: the model's architecture (``'pvt'``; mmpola.registry.ARCHITECTURES), or ''.
        official: the model's name as a checkpoint (``'Pola-PVT'``).
        paper: the release its attention comes from (``'PolaFormer'``), for the fix.
        unchecked: kinds a file need not have (the architecture's softmax: a file of another
            per-stage layout still loads, with those attentions reported missing).
    """
    runtime_buffers = RUNTIME_BUFFERS

    name: str
    hint: str
    structure: FrozenSet[str]
    attention_prefixes: FrozenSet[str]
    kinds: Dict[str, FrozenSet[str]] = field(default_factory=dict)
    examples: Dict[str, str] = field(default_factory=dict)
    titles: Dict[str, str] = field(default_factory=dict)
    family: str = ''
    official: str = ''
    paper: str = ''
    unchecked: FrozenSet[str] = frozenset()

    @classmethod
    def of_model(cls, state_dict, modules, titles, exclude=(), name='the model', hint=None, official='', paper='',
                 unchecked=(), family=''):
        """The signature of a model's ``state_dict``; ``modules``: ``{attention module name: kind}``;
        keys of the ``exclude`` modules (dense-only output norms) are left out."""
        keys = [k for k in state_dict if not any(k == m or k.startswith(m + '.') for m in exclude)]
        prefixes = {module + '.': kind for module, kind in modules.items()}
        structure, kinds, examples = set(), {}, {}
        for key in keys:
            prefix = next((p for p in prefixes if key.startswith(p)), None)
            if prefix is None:
                structure.add(key_pattern(key))
                continue
            kind = prefixes[prefix]
            examples.setdefault(kind, key)
        for prefix, kind in prefixes.items():
            if kind not in kinds:
                kinds[kind] = leaf_signature(k[len(prefix):] for k in keys if k.startswith(prefix))
        return cls(name=name, hint=hint or (next(iter(keys), '') + '*'), structure=frozenset(structure),
                   attention_prefixes=frozenset(key_pattern(p) for p in prefixes), kinds=kinds,
                   examples=examples, titles=dict(titles), family=family, official=official or name, paper=paper,
                   unchecked=frozenset(unchecked))

    def check(self, keys, source, prefix=''):
        """Raise :class:`~mmpola.checkpoint.CheckpointMismatchError` if the file with these keys (the
        model's key space, prefix stripped) is not for this model."""
        keys = list(keys)
        patterns = {key_pattern(k) for k in keys}
        covered = len(self.structure & patterns) / max(len(self.structure), 1)
        groups = {}
        for module_prefix, leaves in attention_modules(keys).items():
            if key_pattern(module_prefix) in self.attention_prefixes:
                groups.setdefault(leaf_signature(leaves), module_prefix)
        if covered < MIN_STRUCTURE or (self.attention_prefixes and not groups):
            raise self._other_model(keys, source, prefix)
        if covered < 1.0 and self.family:
            found = identify(keys)  # another architecture whose structure the file covers better
            if found.model is not None and found.model.family != self.family and found.structure > covered:
                raise self._other_model(keys, source, prefix, found)
        for kind, leaves in self.kinds.items():
            if kind not in self.unchecked and leaves not in groups:
                raise self._other_kind(keys, kind, source)

    def _other_model(self, keys, source, prefix, found=None):
        partly = found is not None  # names shared with another architecture, which the file fits better
        found = found or identify(keys)
        what = (f'its keys fit {found.model.official} better than {self.name}' if partly
                else f'it has no key matching {self.name}')
        msg = (f'checkpoint {source} is not a {self.official} checkpoint: {what} '
               f"(expected keys like '{self.hint}'{', under prefix ' + repr(prefix) if prefix else ''})")
        if found.name:
            msg += f'; it looks like a {found.name} checkpoint'
        msg += f' (its keys look like {list(keys)[:3]}). '
        if found.model is not None:
            msg += (f'Build the backbone that fits the checkpoint ({found.model.fix}), or pass the right prefix '
                    "(e.g. init_cfg=dict(type='Pretrained', checkpoint=..., prefix='backbone.')).")
        else:
            msg += (f'A {self.name} needs a {self.paper or self.official} checkpoint (official release or an mmpola '
                    'classification run), or train from random initialisation with init_cfg=None.')
        return CheckpointMismatchError(msg)

    def _other_kind(self, keys, kind, source):
        title = self.titles.get(kind, kind)
        found = identify(keys)
        softmax_fix = "build the backbone with attn_type='SSSS' (softmax attention in every stage) to use this one"
        others = [m for m in found.kinds if m.kind != kind]
        other = next((m for m in others if not m.softmax), others[0] if others else None)
        if other is not None and other.softmax:
            looks, fix = f'a {other.official} checkpoint', softmax_fix
        elif other is not None:
            looks, fix = f'a {other.official} checkpoint', f'{other.fix} to use this one'
        else:
            looks, fix = f'not a {title} checkpoint', None
        return CheckpointMismatchError(
            f'checkpoint {source} has none of the {title} attention weights of {self.name} (such as '
            f"'{self.examples.get(kind, kind)}'): it looks like {looks}. Loading it would leave every {title} "
            f'attention randomly initialised. Use a checkpoint of {title} attention (official release or an '
            'mmpola classification run)' + (f', {fix}' if fix else '') +
            ', or train from random initialisation with init_cfg=None.')


def describe_backbone(keys):
    """The short name of the backbone a file holds (``'PolaFormer PVT'``), or None."""
    found = identify(keys)
    if found.model is not None:
        return found.model.release
    return found.look_alike.description if found.look_alike is not None else None


def describe_checkpoint(checkpoint):
    """What a checkpoint (the loaded object) holds, in a few words, for error messages: the task
    (an mmdet detector, an mmseg segmentor, a classifier, a bare backbone), the backbone (PolaFormer
    PVT, PolaFormer++, FLatten Transformer Swin, ...) and whether it is in the official release
    format (``{'model': ..., 'config': ...}``)."""
    if not isinstance(checkpoint, dict):
        return f'a {type(checkpoint).__name__}, not a checkpoint dict'
    official = isinstance(checkpoint.get('model'), dict) and any(k in checkpoint for k in ('config', 'max_accuracy'))
    try:
        state_dict, _ = extract_state_dict(checkpoint, use_ema=False)
    except CheckpointMismatchError:
        return f'no weights (top-level keys {sorted(map(str, checkpoint))[:8]})'
    keys = [re.sub(r'^module\.', '', str(k)) for k in state_dict]
    backbone = describe_backbone(keys)
    if any(k.startswith(('roi_head.', 'rpn_head.', 'bbox_head.')) for k in keys):
        task = 'an mmdet detector checkpoint'
    elif any(k.startswith(('decode_head.', 'auxiliary_head.')) for k in keys):
        task = 'an mmseg segmentor checkpoint'
    elif any(re.match(r'(backbone\.)?head\.(fc\.)?weight$', k) for k in keys):
        head = next(v for k, v in state_dict.items()
                    if re.match(r'(module\.)?(backbone\.)?head\.(fc\.)?weight$', str(k)))
        classes = f', {head.shape[0]}-class head' if torch.is_tensor(head) and head.dim() >= 2 else ''
        task = ('an official ' if official else 'a ') + f'classification checkpoint{classes}'
    elif backbone:
        task = 'a backbone-only checkpoint'
    else:
        return f'a checkpoint of an unknown model (keys like {keys[:3]})'
    return f'{task} ({backbone})' if backbone else task
