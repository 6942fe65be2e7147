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


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"top_p": float("nan")},
        {"seed": 2**63},
        {"seed": -(2**63) - 1},
    ],
)
def test_values_torch_would_fail_on_mid_step_are_refused_up_front(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        SamplingParams(**bad)


def sample_per_row(logits, params, generators):
    """The per-row version: each row alone, its own softmax, nucleus and inverse-CDF draw (the oracle)."""
    out = []
    for row, p, gen in zip(logits.float(), params, generators):
        if p.greedy:
            out.append(int(row.argmax()))
            continue
        probs = torch.softmax(row / p.temperature, dim=-1)
        if p.top_p < 1:
            ordered, order = probs.sort(descending=True)
            ordered[ordered.cumsum(-1) - ordered >= p.top_p] = 0
            probs = torch.zeros_like(probs).scatter_(-1, order, ordered)
        u = float(torch.rand((), generator=gen)) if gen is not None else float(torch.rand(()))
        cdf = probs.cumsum(-1)
        out.append(min(int((cdf <= u * cdf[-1]).sum()), int(probs.nonzero().max())))
    return out


def test_vectorised_sampling_equals_the_per_row_version_for_fixed_seeds():
    """Mixed rows: greedy, hot and cold temperatures, nuclei from tiny to full, peaked and flat logits."""
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(12, 300, generator=gen) * torch.tensor([0.1, 1.0, 4.0, 10.0] * 3)[:, None]
    temperatures = [0.0, 0.7, 1.0, 1.5, 1e-6, 0.3, 2.0, 1.0, 0.9, 0.0, 5.0, 0.5]
    top_ps = [1.0, 0.9, 0.5, 1.0, 0.3, 0.05, 1.0, 0.99, 0.7, 0.2, 0.8, 1.0]
    params = [
        SamplingParams(temperature=t, top_p=p, seed=100 + i) for i, (t, p) in enumerate(zip(temperatures, top_ps))
    ]
    fast = [p.generator() for p in params]
    slow = [p.generator() for p in params]
    for step in range(20):  # the generators advance together, step after step
        want = sample_per_row(logits, params, slow)
        got = sample(logits, params, fast).tolist()
        assert got == want, step
        logits = logits.roll(step + 1, dims=-1)
    # unseeded rows draw from torch's default generator, in row order: the same draws as one at a time
    unseeded = [SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=0), SamplingParams(2.0)] * 3
    torch.manual_seed(5)
    want = sample_per_row(logits[:9], unseeded, [None] * 9)
    torch.manual_seed(5)
    assert sample(logits[:9], unseeded, [None] * 9).tolist() == want
