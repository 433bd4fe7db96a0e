"""What every attention core of ``mmpola.ops`` shares: the choice of implementation and the fp32
island under mixed precision (docs/design.md, "Numerical stability under mixed precision")."""
import torch

__all__ = ['ATTN_IMPLS', 'run_attention_core']

# 'reference': the official op order; 'fast': the fused path; 'auto': the fast path
ATTN_IMPLS = ('auto', 'fast', 'reference')


def run_attention_core(reference, fast, impl, fp32, tensors, *options):
    """``reference`` or ``fast`` (by ``impl``) of ``(*tensors, *options)``.

    With ``fp32`` the tensors go in as float32 with autocast disabled and the result comes back in
    the first tensor's dtype; ``options`` (Python numbers) pass unchanged.
    """
    if impl not in ATTN_IMPLS:
        raise ValueError(f"impl must be 'auto', 'fast' or 'reference', got {impl!r}")
    fn = reference if impl == 'reference' else fast
    if not fp32:
        return fn(*tensors, *options)
    with torch.autocast(device_type=tensors[0].device.type, enabled=False):
        out = fn(*(t.float() for t in tensors), *options)
    return out.to(tensors[0].dtype)
