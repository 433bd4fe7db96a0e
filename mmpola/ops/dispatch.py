"""What every attention core of ``mmpola.ops`` shares: the choice of implementation and the fp32
island under mixed precision (docs/design.md, "Numerical stability under mixed precision")."""
import torch

__all__ = ['ATTN_IMPLS', 'check_attn_impl', 'run_attention_core']

# 'reference': the official op order; 'fast': the fused path; 'auto': the fast path
ATTN_IMPLS = ('auto', 'fast', 'reference')


def check_attn_impl(impl, error=ValueError):
    """``impl`` if it is one of ``ATTN_IMPLS``, else ``error`` naming the choices."""
    if impl not in ATTN_IMPLS:
        raise error(f'attn_impl must be one of {", ".join(ATTN_IMPLS)}, got {impl!r}')
    return impl


def run_attention_core(reference, fast, impl, fp32, tensors, *options):
    """``reference`` or ``fast`` (by ``impl``) of ``(*tensors, *options)``.

    With ``fp32`` the tensors go in as float32 with autocast disabled and the result comes back in
    the first tensor's dtype; ``options`` (Python numbers) pass unchanged.
    """
    check_attn_impl(impl)
    fn = reference if impl == 'reference' else fast
    if not fp32:
        return fn(*tensors, *options)
    with torch.autocast(device_type=tensors[0].device.type, enabled=False):
        out = fn(*(t.float() for t in tensors), *options)
    return out.to(tensors[0].dtype)
