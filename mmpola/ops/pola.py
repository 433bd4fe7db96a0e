"""Polarity-aware linear attention core (PolaFormer, ICLR 2025).

Plain functions on per-head tensors; no module state. See ../shared/design/pola_spec.md §1.

Shapes:
    q: (B, h, N, d) queries (after the projection, before the temperature division)
    k: (B, h, n, d) keys (positional encoding already added)
    v: (B, h, n, d) values
    power: (1, h, 1, d) raw exponent logit; p = 1 + alpha * sigmoid(power)
    scale: (1, h, 1, d) raw temperature logit; s = softplus(scale)
Returns (B, h, N, d): per head, the first d/2 channels are the same-sign branch (values v[..., :d/2]),
the last d/2 the opposite-sign branch (values v[..., d/2:]).
"""
import torch
import torch.nn.functional as F


def pola_attention_reference(q, k, v, power, scale, alpha=4.0, eps=1e-6):
    """The official op order (bit-exact to the official modules in fp32)."""
    n = k.shape[-2]
    scale = F.softplus(scale)
    power = 1 + alpha * torch.sigmoid(power)
    q = q / scale
    k = k / scale
    q_pos = F.relu(q) ** power
    q_neg = F.relu(-q) ** power
    k_pos = F.relu(k) ** power
    k_neg = F.relu(-k) ** power
    q_sim = torch.cat([q_pos, q_neg], dim=-1)
    q_opp = torch.cat([q_neg, q_pos], dim=-1)
    k = torch.cat([k_pos, k_neg], dim=-1)
    v1, v2 = torch.chunk(v, 2, dim=-1)

    k_mean_t = k.mean(dim=-2, keepdim=True).transpose(-2, -1)
    z = 1 / (q_sim @ k_mean_t + eps)
    kv = (k.transpose(-2, -1) * (n ** -0.5)) @ (v1 * (n ** -0.5))
    x_sim = q_sim @ kv * z
    z = 1 / (q_opp @ k_mean_t + eps)
    kv = (k.transpose(-2, -1) * (n ** -0.5)) @ (v2 * (n ** -0.5))
    x_opp = q_opp @ kv * z
    return torch.cat([x_sim, x_opp], dim=-1)


def pola_attention(q, k, v, power, scale, alpha=4.0, eps=1e-6, fp32=True, impl='auto'):
    """Pola attention with an fp32 island under autocast.

    Args:
        fp32: compute the core in float32 with autocast disabled (default), then cast back to
            q's dtype. Low-precision matmuls overflow for |q/s| > ~9 at p ~ 5 (spec §4).
        impl: 'reference' (official op order) or 'auto' (fastest available path).
    """
    if impl not in ('auto', 'reference', 'fast'):
        raise ValueError(f"impl must be 'auto', 'fast' or 'reference', got {impl!r}")
    fn = pola_attention_reference
    if fp32:
        out_dtype = q.dtype
        device_type = q.device.type
        with torch.autocast(device_type=device_type, enabled=False):
            out = fn(q.float(), k.float(), v.float(), power.float(), scale.float(), alpha, eps)
        return out.to(out_dtype)
    return fn(q, k, v, power, scale, alpha, eps)
