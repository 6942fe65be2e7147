"""Sampling: greedy, temperature, top-p, per-request seeds; logprobs of chosen tokens."""

from __future__ import annotations

import pytest
import torch

from kvbench.engines.kvengine.model.sampling import SamplingParams, sample, token_logprobs


def draws(params: SamplingParams, logits: torch.Tensor, n: int) -> list[int]:
    gen = params.generator()
    return [int(sample(logits[None], [params], [gen])[0]) for _ in range(n)]


def test_greedy_takes_the_argmax_per_row():
    logits = torch.tensor([[0.1, 3.0, 0.2], [5.0, 1.0, 4.9]])
    assert sample(logits, [SamplingParams(temperature=0)] * 2, [None, None]).tolist() == [1, 0]


def test_same_seed_same_tokens_different_seed_different_tokens():
    logits = torch.zeros(50)
    a = draws(SamplingParams(seed=7), logits, 30)
    assert a == draws(SamplingParams(seed=7), logits, 30)
    assert a != draws(SamplingParams(seed=8), logits, 30)


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    seen = set(draws(SamplingParams(top_p=0.7, seed=0), logits, 300))
    assert seen == {0, 1}
    assert set(draws(SamplingParams(top_p=0.01, seed=0), logits, 50)) == {0}


def test_temperature_sharpens_and_flattens():
    logits = torch.log(torch.tensor([0.6, 0.4]))
    cold = draws(SamplingParams(temperature=0.05, seed=1), logits, 400)
    hot = draws(SamplingParams(temperature=10.0, seed=1), logits, 400)
    assert cold.count(0) > 390
    assert 150 < hot.count(0) < 250


def test_token_logprobs_match_log_softmax_and_top_k_is_sorted():
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(0))
    chosen = torch.tensor([4, 0, 19])
    result = token_logprobs(logits, chosen, top_k=5)
    ref = torch.log_softmax(logits, -1)
    assert torch.allclose(result.logprobs, ref[torch.arange(3), chosen])
    assert torch.equal(result.top_ids[:, 0], logits.argmax(-1))
    assert (result.top_logprobs[:, :-1] >= result.top_logprobs[:, 1:]).all()


def test_bad_params_are_rejected():
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="rows"):
        sample(torch.zeros(2, 3), [SamplingParams()], [None])


def test_a_temperature_below_1e_5_is_greedy_where_dividing_by_it_would_give_nan():
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(1))
    greedy = logits.argmax(-1).tolist()
    for temperature in (1e-40, 9e-6):
        params = SamplingParams(temperature=temperature, seed=3)
        assert params.greedy
        assert sample(logits, [params] * 5, [params.generator()] * 5).tolist() == greedy
    assert not SamplingParams(temperature=1e-5).greedy


@pytest.mark.parametrize("bad", [{"temperature": float("nan")}, {"temperature": float("inf")},
                                 {"top_p": float("nan")}, {"seed": 2**63}, {"seed": -(2**63) - 1}])
def test_values_torch_would_fail_on_mid_step_are_refused_up_front(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)
