"""The implementations of the attention ops and what every op shares: the choice of implementation
and the fp32 island under mixed precision (docs/design.md, "Numerical stability under mixed
precision").

Each op (``'pola'``, ``'flatten'``, ``'inline'``, ``'pacs'``) has one public function
(:func:`mmpola.ops.pola_attention` ...) and a table of implementations, all with the signature of
the op's reference (documented at the top of the op's file):

* ``'reference'``: the official op order, always present (the ground truth of the tests);
* ``'fast'``: the fused PyTorch path of this package, the default on every device;
* ``'triton'``: fused Triton kernels (forward and backward), what ``'auto'`` picks on CUDA;
* any other: one file and one registration, e.g. a fused GPU kernel::

      from mmpola.ops import register_attention_impl

      @register_attention_impl('pola', 'mine', supports=my_check, preferred_on=('cuda',))
      def pola_attention_mine(q, k, v, power, scale, alpha=4.0, eps=1e-6):
          ...

  then ``attn_impl='mine'`` on a backbone (or an attention module) selects it. The op's tests run
  every registered implementation against the reference (tests/ops/test_dispatch.py).

An implementation knows where it runs: ``supports(device, dtype)`` returns None when it runs on
tensors of that device and dtype, else one line saying why not and what to use instead. Asking for
an implementation on tensors it does not support raises :class:`AttnImplUnavailable` with that line;
``'auto'`` takes, per device type, the first implementation registered as ``preferred_on`` it that
supports the tensors, else the op's default (also while torch.compile, torch.jit.trace or an ONNX export
records the model: :func:`recording`). What only the call shows (the Triton kernels on a GPU
with little shared memory at a wide head dim) the implementation checks on entry, before any work,
raising :class:`AttnImplUnavailable`; under ``'auto'`` the call then runs the op's default, and the
reason is given once as a warning. An implementation registered with ``fp32_inside=True``
computes in float32 whatever its inputs' dtype (it loads and casts inside its kernels), so the fp32
island hands it the tensors as they are instead of casting them first.

An op may take a ``key_bias``: a tensor added to the keys (the second tensor) before the attention, such as
the models' learned positional encoding of the keys, shared by the batch. An implementation registered with
``key_bias=True`` takes it as a keyword argument and adds it where it reads the keys (the sum is then no
tensor of its own, neither computed nor kept for the backward); for the others :func:`run_attention_op` adds
it to the keys first, in the tensors' dtype, as a model would.

Every op's output has the shape of its queries (the first tensor). Queries without elements (no
tokens, batch or heads) give an empty output and zero gradients, whatever the implementation
(:func:`empty_attention`); keys without tokens under queries that have some are one clear error:
the mean over an empty key set is undefined.
"""
import contextlib
import os
import warnings

import torch

from mmpola.errors import MMPolaUserError

__all__ = ['AUTO', 'AttentionOp', 'AttnImplUnavailable', 'OPS', 'attention_op', 'register_attention_impl',
           'attention_impls', 'check_attn_impl', 'run_attention_op', 'empty_attention', 'recording',
           'unviewed_when_compiling', 'padding_needed', 'key_bias_operand', 'key_bias_gradient',
           'implementation_from_env', 'apply_function']

AUTO = 'auto'  # the best implementation for the tensors' device ('triton' on CUDA, else 'fast')


# torch.fx's symbolic tracing (newer torch names the test apart from torch.export's)
_fx_tracing = getattr(torch.fx._symbolic_trace, 'is_fx_symbolic_tracing',
                      torch.fx._symbolic_trace.is_fx_tracing)


def recording():
    """True while torch.compile, torch.export, torch.jit.trace or torch.fx's symbolic tracing (timm's feature
    extraction) records the model: they take the ops' PyTorch bodies into their graphs, so ``'auto'`` runs the
    default implementation then (never a Triton launch, which they cannot record or export) and caches keep
    nothing. An ONNX export records through one of them (the TorchScript exporter traces with torch.jit.trace,
    the dynamo exporter with torch.export), so ``torch.onnx.is_in_onnx_export``, which imports the exporters'
    modules at each call, is not asked: the models ask this in every block of every step."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or _fx_tracing()


def unviewed_when_compiling(view):
    """``view`` itself; while torch.compile records the model, a contiguous copy of it, which is no view.

    For a view that the forward keeps for the backward (a convolution's input map, attention's queries).
    Inductor gives such a view of its graph the strides that eager gave it, and to do so it sorts them. With
    dynamic shapes (a detector's changing image sizes, from the second size on) the strides hold the sizes of
    the token grid, an image side floor-divided by the patch size, which may be zero for all the sort knows:
    ``64 * (H // 4)`` against ``64`` has no truth value, and compiling stops with a TypeError. A copy's strides
    are set, not sorted (a copy in the view's own strides would be dropped as a no-op). In a compiled graph it
    is one more copy, fused with what writes it where it can be, and the kernels after it may round otherwise
    than eager's on the view's layout; in eager there is none. (Traced code cannot tell static shapes from
    dynamic ones, so the copy is made with both.) Also before ``contiguous()`` on a permutation that may or may
    not be contiguous with the sizes at hand (Swin's windows: one per row), which would be a guard on them."""
    if torch.compiler.is_compiling():
        return view.clone(memory_format=torch.contiguous_format)
    return view


def padding_needed(*pads):
    """Whether a map is to be padded by ``pads`` (and cropped back after): any of them is not zero; always while
    torch.compile records the model.

    With dynamic shapes (a detector's changing image sizes) the pads are symbolic, the remainders of the map's
    sides by a window, stripe or patch: asking whether they are zero would be a guard on the sizes, and each
    stage's answer would make a compiled graph of its own, up to torch's recompile limit. Padding by zero is
    a copy in the graph, and the sizes are the same either way."""
    return torch.compiler.is_compiling() or any(pads)


class AttnImplUnavailable(MMPolaUserError, ValueError):
    """An attention implementation was asked for on tensors it cannot run on (device, dtype, or a
    package it needs is missing)."""


def implementation_from_env(variable, impls, what):
    """The implementation of ``what`` named by the environment variable ``variable`` (``'auto'`` when unset
    or empty; case and spaces ignored); a name not in ``impls`` is one clear error."""
    impl = os.environ.get(variable, 'auto').strip().lower() or 'auto'
    if impl not in impls:
        raise AttnImplUnavailable(f'{variable}={impl!r} is not an implementation of {what}; use one of '
                                  f'{", ".join(impls)} (or unset it)')
    return impl


class Implementation:
    """One registered implementation: its function, where it runs, and how the fp32 island treats it."""

    def __init__(self, name, fn, supports=None, fp32_inside=False, key_bias=False):
        self.name = name
        self.fn = fn
        self.supports = supports
        self.fp32_inside = fp32_inside
        self.key_bias = key_bias

    def unsupported(self, device, dtype):
        """None if it runs on tensors of ``device`` and ``dtype``, else the reason (one line)."""
        return None if self.supports is None else self.supports(device, dtype)


class AttentionOp:
    """The registered implementations of one attention op.

    Args:
        name: the op's name (``'pola'``).
        function: the public function's name, for messages (``'pola_attention'``).
        example_inputs: ``fn(batch, heads, hw, head_dim, generator) -> (tensors, options)``: inputs of
            the op's signature for an H x W token grid near the trained regime, the differentiable
            tensors first (the tests of every implementation and tools/benchmark.py use them).
        force_compile: for an op whose fast path uses torch.compile, a context manager that makes
            it compile at every size (tools/benchmark.py's 'fast+compile' rows); else None.
    """

    def __init__(self, name, function, example_inputs=None, force_compile=None):
        self.name = name
        self.function = function
        self.example_inputs = example_inputs
        self.force_compile = force_compile
        self.impls = {}  # name -> function
        self.records = {}  # name -> Implementation
        self.preferred = {}  # device type -> [names], in registration order
        self.default = None
        self._auto_cache = {}

    def register(self, impl, fn=None, default=False, supports=None, preferred_on=(), fp32_inside=False,
                 key_bias=False):
        """Register ``fn`` as implementation ``impl`` (usable as a decorator). A name is registered once.

        Args:
            default: make it what ``'auto'`` runs where no ``preferred_on`` implementation applies.
            supports: ``fn(device, dtype) -> None | str``: None where it runs, else why not (one line
                naming the alternative); None: it runs on every device and dtype.
            preferred_on: device types (``'cuda'``) on which ``'auto'`` picks it when it supports the
                tensors.
            fp32_inside: it computes in float32 whatever the inputs' dtype (the fp32 island passes the
                tensors uncast).
            key_bias: it takes a ``key_bias=`` keyword (a tensor broadcastable to the keys, added to them);
                for the others the keys come with the bias added.
        """
        if impl == AUTO:
            raise ValueError(f"'{AUTO}' names the default implementation; register under another name")

        def add(fn):
            if impl in self.impls:
                raise KeyError(f'{self.function} already has an implementation {impl!r}')
            self.impls[impl] = fn
            self.records[impl] = Implementation(impl, fn, supports, fp32_inside, key_bias)
            for device_type in preferred_on:
                self.preferred.setdefault(device_type, []).append(impl)
            if default or self.default is None:
                self.default = impl
            self._auto_cache.clear()
            return fn

        return add if fn is None else add(fn)

    def names(self):
        """``'auto'`` and the registered implementation names."""
        return (AUTO, *sorted(self.impls))

    def choose(self, impl, device=None, dtype=None, error=ValueError):
        """The name of the implementation that ``impl`` runs on tensors of ``device`` and ``dtype``.

        ``'auto'``: the first ``preferred_on`` implementation of the device type that supports them,
        else the default (the default also without a device, and while a tracer records: :func:`recording`).
        A named implementation that does not support them raises :class:`AttnImplUnavailable` with its
        reason.
        """
        if impl == AUTO:
            if device is None or recording():
                return self.default
            device = torch.device(device)
            key = (device.type, dtype)
            name = self._auto_cache.get(key)
            if name is None:
                name = next((n for n in self.preferred.get(device.type, ())
                             if self.records[n].unsupported(device, dtype) is None), self.default)
                self._auto_cache[key] = name
            return name
        if impl not in self.impls:
            raise error(f'attn_impl must be one of {", ".join(self.names())} (the implementations of '
                        f'{self.function}), got {impl!r}')
        if device is not None:
            reason = self.records[impl].unsupported(torch.device(device), dtype)
            if reason is not None:
                raise AttnImplUnavailable(f"attn_impl={impl!r} ({self.function}) cannot run here: {reason}")
        return impl

    def resolve(self, impl, error=ValueError, device=None, dtype=None):
        """The function of implementation ``impl`` for tensors of ``device`` and ``dtype``
        (:meth:`choose`)."""
        return self.impls[self.choose(impl, device, dtype, error)]

    def unsupported(self, impl, device, dtype=None):
        """None if implementation ``impl`` runs on tensors of ``device`` and ``dtype``, else why not."""
        return self.records[impl].unsupported(torch.device(device), dtype)


# op name -> AttentionOp; each op file registers its reference and fast path
OPS = {}


def attention_op(name, function=None, **kwargs):
    """The :class:`AttentionOp` named ``name`` (created by the op's file with ``function`` and the
    other :class:`AttentionOp` arguments)."""
    if name not in OPS:
        if function is None:
            raise KeyError(f'unknown attention op {name!r}; ops: {", ".join(OPS)}')
        OPS[name] = AttentionOp(name, function, **kwargs)
    return OPS[name]


def register_attention_impl(op, impl, fn=None, default=False, supports=None, preferred_on=(), fp32_inside=False,
                            key_bias=False):
    """Register ``fn`` as implementation ``impl`` of ``op`` (``'pola'``, ``'flatten'``, ``'inline'``,
    ``'pacs'``); usable as a decorator. It takes the arguments of the op's reference; the other
    arguments are those of :meth:`AttentionOp.register`."""
    return attention_op(op).register(impl, fn, default=default, supports=supports, preferred_on=preferred_on,
                                     fp32_inside=fp32_inside, key_bias=key_bias)


def attention_impls(op=None):
    """Implementation names of ``op`` (with ``'auto'``), or of every op when ``op`` is None."""
    if op is not None:
        return attention_op(op).names()
    return tuple(sorted({name for o in OPS.values() for name in o.names()}))


def check_attn_impl(impl, error=ValueError, op=None):
    """``impl`` if ``op`` has it (any op when None), else ``error`` naming the choices."""
    names = attention_impls(op)
    if impl not in names:
        where = f'the implementations of {attention_op(op).function}' if op else 'the registered implementations'
        raise error(f'attn_impl must be one of {", ".join(names)} ({where}), got {impl!r}')
    return impl


class _EmptyAttention(torch.autograd.Function):
    """The empty output of queries without elements; zero gradients for every input."""

    @staticmethod
    def forward(ctx, q, *others):
        ctx.inputs = [(t.shape, t.dtype, t.device) for t in (q, *others)]
        return q.new_empty(q.shape)

    @staticmethod
    def backward(ctx, grad_out):
        return tuple(torch.zeros(shape, dtype=dtype, device=device) for shape, dtype, device in ctx.inputs)


def empty_attention(function, tensors):
    """The output of attention op ``function`` (its name, for the message) when the queries
    ``tensors[0]`` have no elements: an empty tensor of their shape whose backward gives every tensor a
    zero gradient (nothing depends on them); None when the queries have elements. Keys ``tensors[1]``
    without elements under queries that have some raise ValueError (one line). None entries (an
    optional operand not given, such as a key bias) are left out."""
    q, k = tensors[0], tensors[1]
    if q.numel() == 0:
        return _EmptyAttention.apply(*(t for t in tensors if t is not None))
    if k.numel() == 0:
        raise ValueError(f'{function} got keys without tokens (k of shape {tuple(k.shape)}) for queries of shape '
                         f'{tuple(q.shape)}: attention over an empty key set is undefined; give at least one key '
                         'token or skip the attention for this input')
    return None


def run_attention_op(op, impl, fp32, tensors, *options, key_bias=None):
    """Implementation ``impl`` of ``op`` on ``(*tensors, *options)``.

    With ``fp32`` the tensors go in as float32 (float64 when one of them is: the island widens, never
    narrows) with autocast disabled and the result comes back in the first tensor's dtype (an implementation
    registered ``fp32_inside`` gets float16 / bfloat16 / float32 tensors uncast and computes in float32
    itself); ``options`` (Python numbers) pass unchanged. ``'auto'`` is chosen
    for the first tensor's device and the dtype the implementation computes in; when the chosen one
    turns the call down on entry (:class:`AttnImplUnavailable`), the op's default runs it.
    ``key_bias`` (None, or a tensor broadcastable to the keys ``tensors[1]``) is added to the keys:
    by an implementation registered ``key_bias`` where it reads them, else here, before the fp32 island.
    """
    attention = attention_op(op)
    first = tensors[0]
    name = attention.choose(impl, first.device, _island_dtype(tensors) if fp32 else first.dtype)
    empty = empty_attention(attention.function, (*tensors, key_bias))
    if empty is not None:
        return empty
    try:
        return _run(attention, name, fp32, tensors, options, key_bias)
    except AttnImplUnavailable as declined:
        if impl != AUTO or name == attention.default:
            raise
        _warn_once(f"{attention.function}: attn_impl='auto' runs {attention.default!r} instead of {name!r} for "
                   f'these inputs: {declined}')
        return _run(attention, attention.default, fp32, tensors, options, key_bias)


def key_bias_operand(function, k, key_bias):
    """``key_bias`` as an implementation that adds it where it reads the keys ``k`` takes it: checked to be
    broadcastable to k (else ValueError naming ``function``), with k's number of dims (sizes 1 where it is
    shared: read with stride 0) and in the dtype of ``k + key_bias`` (the kernels round the sum to it; the
    keys' own for the models' encodings, so no copy). None stays None."""
    if key_bias is None:
        return None
    # broadcastable to k (as torch.broadcast_shapes(key_bias.shape, k.shape) == k.shape, without its symbolic
    # shape machinery: the Triton implementations take concrete shapes only)
    if key_bias.dim() > k.dim() or any(size not in (1, full) for size, full in zip(reversed(key_bias.shape),
                                                                                    reversed(k.shape))):
        raise ValueError(f'{function} takes key_bias broadcastable to the keys {tuple(k.shape)}; got shape '
                         f'{tuple(key_bias.shape)}')
    key_bias = key_bias.to(torch.result_type(k, key_bias))
    return key_bias.reshape((1, ) * (k.dim() - key_bias.dim()) + tuple(key_bias.shape))


def key_bias_gradient(grad_k, key_bias):
    """The gradient of a key bias (of :func:`key_bias_operand`) from the keys' ``grad_k``: summed over the dims
    along which the bias is broadcast, written in the bias's own layout and dtype (one sum; the models' bias,
    a view of their (1, n, C) encoding, passes it on to the encoding without a copy)."""
    dims = tuple(i for i, (size, full) in enumerate(zip(key_bias.shape, grad_k.shape)) if size == 1 and full != 1)
    if not dims:
        return grad_k.to(key_bias.dtype)
    return torch.sum(grad_k, dims, keepdim=True, dtype=key_bias.dtype, out=torch.empty_like(key_bias))


_WARNED = set()


def _warn_once(message):
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, stacklevel=3)


_AUTOCAST_DEVICES = ('cuda', 'cpu')  # device types every build of torch has autocast for


def autocast_dtype(device_type):
    """The dtype autocast runs in on ``device_type`` where it is on there, else None (also for device types
    autocast does not know, such as ``'meta'``)."""
    if device_type not in _AUTOCAST_DEVICES and not torch.amp.is_autocast_available(device_type):
        return None
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None


def promoted_dtype(a, b):
    """The dtype of the sum of tensors of float dtypes a and b, as ``torch.promote_types`` gives it. That function
    is an operator the host dispatches; this is plain Python, which torch.compile traces without a cache."""
    if a == b:
        return a
    if a.itemsize == b.itemsize:  # float16 and bfloat16
        return torch.float32
    return a if a.itemsize > b.itemsize else b


class _UnrecordedContext:
    """The context an autograd Function's forward gets from :func:`apply_function` where autograd records nothing:
    it keeps what the forward sets on it and nothing for a backward."""

    def save_for_backward(self, *tensors):
        pass


def apply_function(function, *args):
    """``function.apply(*args)`` for an autograd Function of mmpola's kernels where autograd records the call (grad
    mode on and a tensor argument that requires its gradient); elsewhere (inference, evaluation under no_grad, a
    frozen module) the Function's forward alone, which computes the same outputs without what ``apply`` adds to
    the host's time of every call for a backward that will not run. The forwards call nothing of their context
    but ``save_for_backward``."""
    if torch.is_grad_enabled():
        for arg in args:
            if isinstance(arg, torch.Tensor) and arg.requires_grad:
                return function.apply(*args)
    return function.forward(_UnrecordedContext(), *args)


def autocast_off(device_type):
    """A context in which autocast is off on ``device_type`` (nothing to do where it is off already, or where
    autocast does not know the device type)."""
    if autocast_dtype(device_type) is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, enabled=False)


def _island_dtype(tensors):
    """The dtype of the fp32 island: float32, or float64 when an input is (a model run in double precision)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _run(attention, name, fp32, tensors, options, key_bias=None):
    first = tensors[0]
    record = attention.records[name]
    if key_bias is not None and not record.key_bias:
        # the keys with the bias added, in their dtype (as a model adds an encoding)
        tensors, key_bias = (first, tensors[1] + key_bias, *tensors[2:]), None
    biases = () if key_bias is None else (key_bias,)

    def call(tensors, biases):
        return record.fn(*tensors, *options, **({'key_bias': biases[0]} if biases else {}))

    if not fp32:
        return call(tensors, biases)
    low = (torch.float16, torch.bfloat16, torch.float32)
    island = _island_dtype((*tensors, *biases))
    with autocast_off(first.device.type):
        if not (record.fp32_inside and all(t.dtype in low for t in (*tensors, *biases))):
            tensors, biases = tuple(t.to(island) for t in tensors), tuple(t.to(island) for t in biases)
        out = call(tensors, biases)
    return out.to(first.dtype)
