"""The implementations of the attention ops and what every op shares: the choice of implementation
and the fp32 island under mixed precision (docs/design.md, "Numerical stability under mixed
precision").

Each op (``'pola'``, ``'flatten'``, ``'inline'``, ``'pacs'``) has one public function
(:func:`mmpola.ops.pola_attention` ...) and a table of implementations, all with the signature of
the op's reference (documented at the top of the op's file):

* ``'reference'``: the official op order, always present (the ground truth of the tests);
* ``'fast'``: the fused path of this package, the default (``'auto'``);
* any other: one file and one registration, e.g. a fused GPU kernel::

      from mmpola.ops import register_attention_impl

      @register_attention_impl('pola', 'triton')
      def pola_attention_triton(q, k, v, power, scale, alpha=4.0, eps=1e-6):
          ...

  then ``attn_impl='triton'`` on a backbone (or an attention module) selects it. The op's tests run
  every registered implementation against the reference (tests/ops/test_implementations.py).
"""
import torch

__all__ = ['AUTO', 'AttentionOp', 'OPS', 'attention_op', 'register_attention_impl', 'attention_impls',
           'check_attn_impl', 'run_attention_op']

AUTO = 'auto'  # the op's default implementation ('fast' where there is one)


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
        self.impls = {}
        self.default = None

    def register(self, impl, fn=None, default=False):
        """Register ``fn`` as implementation ``impl`` (usable as a decorator); ``default`` makes it what
        ``'auto'`` runs. A name is registered once."""
        if impl == AUTO:
            raise ValueError(f"'{AUTO}' names the default implementation; register under another name")

        def add(fn):
            if impl in self.impls:
                raise KeyError(f'{self.function} already has an implementation {impl!r}')
            self.impls[impl] = fn
            if default or self.default is None:
                self.default = impl
            return fn

        return add if fn is None else add(fn)

    def unregister(self, impl):
        """Remove implementation ``impl`` (the reference stays)."""
        if impl == 'reference':
            raise ValueError('the reference implementation is always present')
        self.impls.pop(impl)
        if self.default == impl:
            self.default = 'fast' if 'fast' in self.impls else 'reference'

    def names(self):
        """``'auto'`` and the registered implementation names."""
        return (AUTO, *sorted(self.impls))

    def resolve(self, impl, error=ValueError):
        """The function of implementation ``impl`` (``'auto'``: the default)."""
        name = self.default if impl == AUTO else impl
        if name not in self.impls:
            raise error(f'attn_impl must be one of {", ".join(self.names())} (the implementations of '
                        f'{self.function}), got {impl!r}')
        return self.impls[name]


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


def register_attention_impl(op, impl, fn=None, default=False):
    """Register ``fn`` as implementation ``impl`` of ``op`` (``'pola'``, ``'flatten'``, ``'inline'``,
    ``'pacs'``); usable as a decorator. It takes the arguments of the op's reference."""
    return attention_op(op).register(impl, fn, default=default)


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


def run_attention_op(op, impl, fp32, tensors, *options):
    """Implementation ``impl`` of ``op`` on ``(*tensors, *options)``.

    With ``fp32`` the tensors go in as float32 with autocast disabled and the result comes back in
    the first tensor's dtype; ``options`` (Python numbers) pass unchanged.
    """
    fn = attention_op(op).resolve(impl)
    if not fp32:
        return fn(*tensors, *options)
    with torch.autocast(device_type=tensors[0].device.type, enabled=False):
        out = fn(*(t.float() for t in tensors), *options)
    return out.to(tensors[0].dtype)
