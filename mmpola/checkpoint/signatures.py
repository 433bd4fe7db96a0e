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

Names and patterns do not tell a model's size: a Pola-PVT-S file has every key pattern of a Pola-PVT-T.
The blocks do: :func:`block_layout` reads, stage by stage, how many blocks a file (or a model) has, their
width and the attention kind of each (:class:`BlockLayout`), and :meth:`KeySignature.check_layout`
refuses a file whose blocks differ from the model's (another depth, size or per-stage layout), naming
both (``Pola-PVT-S: 3-4-6-3 blocks``); loading it would fill the model with the first blocks of each
stage of another model, or leave blocks at random. Every loader calls it; each has its own explicit
way to load the blocks both have on purpose (the message names it).

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
           'identify', 'attention_modules', 'leaf_signature', 'describe_checkpoint', 'describe_backbone',
           'BlockLayout', 'block_layout']

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


# a block's prefix in front of its attention module: '<stage>.<index>.' ('block1.0.', 'layers.2.blocks.1.')
BLOCK = re.compile(r'^(.*)\.(\d+)\.$')
UNKNOWN_KIND = '?'


def _natural(text):
    return [int(part) if part.isdigit() else part for part in re.split(r'(\d+)', text)]


@dataclass(frozen=True)
class BlockLayout:
    """The blocks of a file or a model, stage by stage.

    Attributes:
        stages: ``((stage, kinds, width), ...)`` in order: ``stage`` the key prefix of its blocks
            (``'block1'``, ``'layers.0.blocks'``), ``kinds`` the attention kind of each block
            (``'?'``: not one the comparison knows), ``width`` the blocks' channels (None when only
            the keys are known).
    """
    stages: tuple = ()

    @property
    def depths(self):
        return tuple(len(kinds) for _, kinds, _ in self.stages)

    @property
    def widths(self):
        return tuple(width for _, _, width in self.stages)

    @property
    def kinds(self):
        return tuple(kinds for _, kinds, _ in self.stages)

    def blocks_text(self):
        """``'3-4-6-3 blocks'``."""
        return '-'.join(map(str, self.depths)) + ' blocks'

    def widths_text(self):
        return 'widths ' + '-'.join('?' if w is None else str(w) for w in self.widths)

    def letters_text(self, letters):
        """The per-stage attention in the official letters (``'LLSS'``; ``'M'`` a stage of several kinds)."""
        out = ''
        for kinds in self.kinds:
            found = {letters.get(k, UNKNOWN_KIND) for k in kinds}
            out += found.pop() if len(found) == 1 else 'M'
        return 'attention ' + out

    def differences(self, other):
        """What differs from ``other``: a subset of ``('blocks', 'widths', 'attention')``; widths only
        where both are known."""
        out = []
        if [s for s, _, _ in self.stages] != [s for s, _, _ in other.stages] or self.depths != other.depths:
            out.append('blocks')
        if any(a is not None and b is not None and a != b for a, b in zip(self.widths, other.widths)):
            out.append('widths')
        if 'blocks' not in out and self.kinds != other.kinds:
            out.append('attention')
        return out


def block_layout(tensors, kind_of):
    """The :class:`BlockLayout` of ``tensors`` (a mapping key -> tensor, or only keys: widths then
    unknown); ``kind_of(module prefix, leaves)`` names the attention kind of a module."""
    keys = [str(k) for k in tensors]
    shapes = {}
    if isinstance(tensors, dict):
        shapes = {str(k): tuple(v.shape) for k, v in tensors.items() if hasattr(v, 'shape')}
    modules = attention_modules(keys)
    blocks = {}  # block prefix -> (stage, index, kind)
    for module, leaves in modules.items():
        block = re.sub(r'(?:attn|attns\.\d+)\.$', '', module)
        match = BLOCK.match(block)
        if match and block not in blocks:
            blocks[block] = (match.group(1), int(match.group(2)), kind_of(module, leaves))
    stages = {}
    for block, (stage, index, kind) in blocks.items():
        stages.setdefault(stage, {})[index] = (block, kind)
    out = []
    for stage in sorted(stages, key=_natural):
        entries = [stages[stage][i] for i in sorted(stages[stage])]
        first = entries[0][0]
        lengths = [shape[0] for key, shape in shapes.items() if key.startswith(first) and len(shape) == 1
                   and not any(key.startswith(m) for m in modules)]
        width = max(sorted(set(lengths)), key=lengths.count) if lengths else None
        out.append((stage, tuple(kind for _, kind in entries), width))
    return BlockLayout(tuple(out))


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
        letter: the kind's letter in the official per-stage layouts (``'L'``).
        sizes: ``sizes()`` -> ``{arch name: (short name, BlockLayout)}`` of its presets, for messages.
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
    letter: str = ''
    sizes: Optional[Callable] = field(default=None, compare=False, repr=False)


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
        unchecked: kinds a file need not have somewhere (the architecture's softmax).
        layout: the model's :class:`BlockLayout` (its blocks per stage, their widths and kinds).
        letters: ``{kind: letter}`` of the official per-stage layouts, for messages.
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
    layout: BlockLayout = BlockLayout()
    letters: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def of_model(cls, state_dict, modules, titles, exclude=(), name='the model', hint=None, official='', paper='',
                 unchecked=(), family='', letters=None):
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
        layout = block_layout({k: state_dict[k] for k in keys},
                              lambda module, leaves: prefixes.get(module, UNKNOWN_KIND))
        return cls(name=name, hint=hint or (next(iter(keys), '') + '*'), structure=frozenset(structure),
                   attention_prefixes=frozenset(key_pattern(p) for p in prefixes), kinds=kinds,
                   examples=examples, titles=dict(titles), family=family, official=official or name, paper=paper,
                   unchecked=frozenset(unchecked), layout=layout, letters=dict(letters or {}))

    def check(self, keys, source, prefix='', layout=True, partial_option=None):
        """Raise :class:`~mmpola.checkpoint.CheckpointMismatchError` if the file with these keys (the
        model's key space, prefix stripped; a mapping to the tensors also compares the widths) is not
        for this model: another architecture or attention kind, and with ``layout`` other blocks
        (:meth:`check_layout`, whose message offers ``partial_option``)."""
        tensors = keys if isinstance(keys, dict) else None
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
        if layout:
            self.check_layout(tensors if tensors is not None else keys, source, partial_option)

    def _kind_of_leaves(self):
        """``(module prefix, leaves) -> kind`` by the leaf signatures of the model's kinds, then of the
        known kinds of its architecture."""
        by_leaves = {}
        for entry in known_models():
            if isinstance(entry, KnownModel) and entry.family == self.family:
                by_leaves.setdefault(entry.leaves, entry.kind)
        by_leaves.update({leaves: kind for kind, leaves in self.kinds.items()})
        return lambda module, leaves: by_leaves.get(leaf_signature(leaves), UNKNOWN_KIND)

    def _letters(self):
        letters = {e.kind: e.letter for e in known_models() if isinstance(e, KnownModel) and e.letter}
        return dict(letters, **self.letters)

    def _size_name(self, layout, official=None):
        """``('Pola-PVT-S', 'small')`` when ``layout`` is that of a preset size of this architecture with
        this official name (or of ``official``), else ``(None, None)``."""
        official = official or self.official
        for entry in known_models():
            if not isinstance(entry, KnownModel) or entry.family != self.family or entry.official != official \
                    or entry.sizes is None:
                continue
            for arch, (short, size_layout) in entry.sizes().items():
                if not size_layout.differences(layout) and not layout.differences(size_layout):
                    return f'{official}-{short}', arch
        return None, None

    def _describe_layout(self, layout, shown, official):
        name, arch = self._size_name(layout, official)
        details = [layout.blocks_text()]
        if 'widths' in shown:
            details.append(layout.widths_text())
        if 'attention' in shown:
            details.append(layout.letters_text(self._letters()))
        return f'{name or official}: {", ".join(details)}', arch

    def check_layout(self, tensors, source, partial_option=None):
        """Raise :class:`~mmpola.checkpoint.CheckpointMismatchError` if the blocks of the file with
        these tensors (or keys: widths not compared) differ from the model's (:class:`BlockLayout`)."""
        theirs = block_layout(tensors, self._kind_of_leaves())
        if not theirs.stages or not self.layout.stages:
            return
        differ = theirs.differences(self.layout)
        if not differ:
            return
        found = identify(list(tensors))
        file_official = found.model.official if found.model is not None and found.model.family == self.family \
            else self.official
        shown = set(differ)
        file_text, file_arch = self._describe_layout(theirs, shown, file_official)
        model_text, _ = self._describe_layout(self.layout, shown, self.official)
        what = {'blocks': 'blocks per stage', 'widths': 'widths', 'attention': 'attention per stage'}
        if 'blocks' in differ and sum(theirs.depths) > sum(self.layout.depths):
            effect = ("the model would get the first blocks of each of the file's stages and the others "
                      'would stay unused')
        elif 'blocks' in differ:
            effect = 'blocks of the model would stay randomly initialised'
        elif 'widths' in differ:
            effect = 'only the tensors of the same shape would load, the others would stay randomly initialised'
        else:
            effect = 'the attention of the blocks of another kind would stay randomly initialised'
        build = f" (arch='{file_arch}')" if file_arch else ''
        raise CheckpointMismatchError(
            f'{source} does not fit {self.name}: the file holds {file_text}, the model is {model_text} '
            f'(other {" and ".join(what[d] for d in differ)}); loading it, {effect}. Use a checkpoint of this '
            f'model ({model_text.split(":")[0]}), or build the backbone the file fits{build}; to load the blocks '
            f'both have on purpose: {partial_option or "strict=False"}.')

    def _other_model(self, keys, source, prefix, found=None):
        partly = found is not None  # names shared with another architecture, which the file fits better
        found = found or identify(keys)
        what = (f'its keys fit {found.model.official} better than {self.name}' if partly
                else f'it has no key matching {self.name}')
        msg = (f'{source} is not a {self.official} checkpoint: {what} '
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
            f'{source} has none of the {title} attention weights of {self.name} (such as '
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
