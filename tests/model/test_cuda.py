"""The CUDA path (bf16 and fp32): skipped where torch.cuda.is_available() is false; the CPU
versions of these checks always run in test_decode.py."""

import pytest
import torch

from model.decode import begin_turn, step
from model.kv_cache import KVCache
from model.params import DecodeParams
from model.policy import active_positions
from tests.fakes import PROMPT, assert_same_cache, random_model, round_trip, uncached_logits

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-4), (torch.bfloat16, 6e-2)])
@torch.no_grad()
def test_cached_equals_uncached_on_cuda(dtype: torch.dtype, atol: float) -> None:
    model = random_model(0).to("cuda", dtype)
    params = DecodeParams(window=4, tau=0.3, max_new_tokens=24)
    cache = KVCache.for_model(model.cfg, dtype=dtype, device="cuda")
    state = begin_turn(model, cache, None, PROMPT, params)
    while not state.done:
        ref = uncached_logits(model, cache, state, active_positions(state, params, model.cfg.mask_id))
        ev = step(model, cache, state, params)
        torch.testing.assert_close(ev.logits.float(), ref.float(), atol=atol, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_bytes_round_trip_from_cuda(dtype: torch.dtype) -> None:
    model = random_model(0).to("cuda", dtype)
    cache = KVCache.for_model(model.cfg, dtype=dtype, device="cuda")
    begin_turn(model, cache, None, PROMPT, DecodeParams(max_new_tokens=4))
    back = round_trip(cache, device="cuda")
    assert back.k.device.type == "cuda"
    assert_same_cache(cache, back)


def test_batched_decoding_equals_alone_on_cuda() -> None:
    """model/batch.py on a GPU (its steps attend in one padded call, its long inputs alone):
    sequences of different lengths, policies and windows, joining mid-batch, with second turns
    whose inputs are committed in the batch, decode the tokens each decodes alone (fp32)."""
    from tests.model.test_batch import Run, Turn, _prompt, assert_same

    model = random_model(0).to("cuda")
    g = torch.Generator().manual_seed(3)
    runs = []
    for i, (policy, W) in enumerate([("set", 4), ("prefix", 8), ("ar", 1), ("block", 4), ("prefix", 3)]):
        p = DecodeParams(policy=policy, window=W, tau=0.3, max_new_tokens=12 + 3 * i)
        runs.append(Run([Turn(_prompt(g, 5 + 9 * i, model.cfg.vocab_size), p),
                         Turn(_prompt(g, 40 if i == 2 else 4, model.cfg.vocab_size), p)], join=i))
    assert_same(model, runs, in_batch=True)
