"""Queries without elements (no tokens, or B * h = 0) give every op, through the dispatch and
through each implementation, an empty output of the queries' shape and zero gradients; keys without
tokens under queries that have some are one clear error."""
import pytest
import torch

from mmpola.ops import OPS
from mmpola.ops.dispatch import run_attention_op

OP_NAMES = ('pola', 'flatten', 'inline', 'pacs')


def _inputs(op_name, batch, tokens, keys=None):
    """The op's example inputs (2 heads, head dim 16) cut to ``batch`` samples, ``tokens`` queries and
    ``keys`` keys (default: ``tokens``)."""
    tensors, options = OPS[op_name].example_inputs(2, 2, (3, 4), 16, torch.Generator().manual_seed(0))
    keys = tokens if keys is None else keys
    token_dim = 2 if tensors[0].dim() == 4 else 1
    cut = [t.narrow(0, 0, batch).narrow(token_dim, 0, tokens if i == 0 else keys) if i < 3 else t
           for i, t in enumerate(tensors)]
    if op_name == 'pacs':  # the rotary tables follow the tokens
        options = (options[0][:tokens], options[1][:tokens], *options[2:])
    return [t.detach().clone().requires_grad_() for t in cut], options


def _check_empty(out, tensors):
    assert out.shape == tensors[0].shape and out.numel() == 0 and out.dtype == tensors[0].dtype
    out.sum().backward()
    for t in tensors:
        assert t.grad is not None and t.grad.shape == t.shape and not t.grad.any()


@pytest.mark.parametrize('op_name', OP_NAMES)
@pytest.mark.parametrize('batch, tokens', [(2, 0), (0, 12)], ids=['no-tokens', 'no-batch'])
def test_every_implementation_gives_an_empty_output_and_zero_gradients(op_name, batch, tokens):
    for impl in sorted(OPS[op_name].impls):
        tensors, options = _inputs(op_name, batch, tokens)
        _check_empty(run_attention_op(op_name, impl, True, tensors, *options), tensors)
    # the Triton kernels' entry point itself, as a caller without the dispatch reaches it
    tensors, options = _inputs(op_name, batch, tokens)
    _check_empty(OPS[op_name].impls['triton'](*tensors, *options), tensors)


@pytest.mark.parametrize('op_name', ['pola', 'flatten', 'inline'])
def test_keys_without_tokens_are_one_clear_error(op_name):
    tensors, options = _inputs(op_name, 2, 12, keys=0)
    for impl in ('triton', 'reference'):
        with pytest.raises(ValueError, match='empty key set') as err:
            run_attention_op(op_name, impl, True, tensors, *options)
        assert '\n' not in str(err.value)
