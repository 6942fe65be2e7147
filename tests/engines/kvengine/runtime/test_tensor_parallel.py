"""Tensor parallel on CPU (a gloo group; collectives through shared memory): the engine at TP=2 (this process is rank 0, rank 1 a real worker process started
by `RankProcesses`, as `kvbench serve` starts it) against the same engine at TP=1, on the tiny model."""

from __future__ import annotations

import platform

import pytest
import torch
import torch.distributed as dist

from kvbench.engines.kvengine.model.batch import SequenceChunk
from kvbench.engines.kvengine.model.parallel import TensorParallel
from kvbench.engines.kvengine.model.tiny import TINY_CONFIG, tiny_model
from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.runtime.model_runner import Forward
from kvbench.engines.kvengine.runtime.requests import GenerationRequest
from kvbench.engines.kvengine.server.ranks import RankProcesses
from kvbench.engines.kvengine.server.shm_collectives import SharedMemoryCollectives
from kvbench.engines.kvengine.settings.config import EngineConfig

from .tiers_fixtures import run, tokens

# 12 pages: the four requests of the batch below cannot all hold their KV at once, so the plan preempts (swaps)
SETTINGS = {"model": "tiny-random", "kv_capacity": 192, "max_step_tokens": 128, "threads": 1}
PREFIX = list(range(300, 380))  # 80 tokens = 5 pages


def requests() -> list[list[GenerationRequest]]:
    """Rounds of requests, each run to completion: a prompt, the same prompt with another ending (its first
    pages come from the prefix cache), then four at once under chunked prefill and preemption."""
    ask = lambda rid, prompt, n=8: GenerationRequest(rid, tuple(prompt), n, ignore_eos=True, logprobs=3)  # noqa: E731
    return [
        [ask("a", PREFIX)],
        [ask("b", PREFIX + [7, 8, 9])],
        [ask(f"c{i}", list(range(200 + 13 * i, 260 + 13 * i)), 24) for i in range(4)],
    ]


class RecordingScheduler:
    """The engine's scheduler, counting the requests its plans preempt."""

    def __init__(self, scheduler) -> None:
        self.scheduler, self.preempted = scheduler, 0

    def schedule(self, now):
        plan = self.scheduler.schedule(now)
        self.preempted += len(plan.preempted)
        return plan

    def __getattr__(self, name):
        return getattr(self.scheduler, name)


def outcome(engine: Engine) -> tuple[dict[str, list], int]:
    """Every request's outputs, and how many times the plan preempted a request."""
    engine.scheduler = recording = RecordingScheduler(engine.scheduler)
    out = {}
    for round_ in requests():
        out.update(run(engine, *round_))
    return out, recording.preempted


@pytest.fixture(scope="module")
def engines():
    config = EngineConfig(**SETTINGS, tensor_parallel_size=2)
    workers = RankProcesses(config)
    exits: list[tuple[int, int, int]] = []
    ranks = workers.start(on_exit=lambda *exit_: exits.append(exit_))
    try:
        yield Engine(EngineConfig(**SETTINGS)), Engine(config, ranks=ranks), ranks
    finally:
        workers.close()
        dist.destroy_process_group()
    assert exits == [], "the worker rank died"


def test_tp2_gives_the_same_greedy_tokens_logprobs_and_cached_tokens_as_tp1(engines):
    single, sharded, _ = engines
    assert sharded.kv_cache.config.num_kv_heads == TINY_CONFIG.num_kv_heads // 2  # each rank: its own KV head
    assert sharded.pool.capacity == single.pool.capacity  # the same page ids on every rank
    (want, want_preempted), (got, got_preempted) = outcome(single), outcome(sharded)
    assert sum(len(o) for o in want.values()) > 0
    assert got["b"][-1].cached_tokens == 80 and want["b"][-1].cached_tokens == 80
    for rid in want:
        assert tokens(got[rid]) == tokens(want[rid]), rid
        assert [o.cached_tokens for o in got[rid]] == [o.cached_tokens for o in want[rid]], rid
        for mine, theirs in zip(got[rid], want[rid]):
            if theirs.logprob is not None:
                assert mine.logprob.logprob == pytest.approx(theirs.logprob.logprob, abs=1e-4)
    assert got_preempted == want_preempted > 0


def test_tp2_logits_equal_tp1_within_1e_4(engines):
    single, sharded, ranks = engines
    if platform.machine().lower() in ("x86_64", "amd64"):  # the exchanges above went through shared memory
        assert isinstance(ranks.parallel.collectives, SharedMemoryCollectives)
    # a fresh sequence in pages no request holds any more: a prefill of 40 tokens and one decode token
    op = Forward((SequenceChunk(list(range(40, 80)), 0, (1, 2, 3)), SequenceChunk([5], 16, (4, 5))))
    ranks.send(op)
    got = sharded.runner.execute(op).logits
    want = single.runner.execute(op).logits
    assert got.shape == want.shape == (2, TINY_CONFIG.vocab_size)
    assert torch.allclose(got, want, atol=1e-4, rtol=0), (got - want).abs().max()


@pytest.mark.parametrize("size", [2, 4])
def test_every_ranks_query_heads_read_the_kv_head_it_holds(size):
    """KV heads sharded (2 heads, 2 ranks) or replicated (2 heads, 4 ranks: two ranks hold each)."""
    full = tiny_model(0).state_dict()
    c = TINY_CONFIG
    d, group = c.head_dim, c.num_heads // c.num_kv_heads
    held_q, held_kv = [], []
    for rank in range(size):
        part = TensorParallel(rank, size).shard_state_dict(full, c)
        q = part["model.layers.0.self_attn.q_proj.weight"].view(-1, d, c.hidden_size)
        k = part["model.layers.0.self_attn.k_proj.weight"].view(-1, d, c.hidden_size)
        q_heads = [
            h
            for h in range(c.num_heads)
            if any(
                torch.equal(q[i], full["model.layers.0.self_attn.q_proj.weight"].view(-1, d, c.hidden_size)[h])
                for i in range(len(q))
            )
        ]
        kv_heads = [
            h
            for h in range(c.num_kv_heads)
            if torch.equal(k[0], full["model.layers.0.self_attn.k_proj.weight"].view(-1, d, c.hidden_size)[h])
        ]
        assert len(q) == c.num_heads // size and len(k) == max(c.num_kv_heads // size, 1)
        assert {h // group for h in q_heads} == set(kv_heads), (rank, q_heads, kv_heads)
        held_q += q_heads
        held_kv += kv_heads
    assert sorted(held_q) == list(range(c.num_heads))  # every query head on exactly one rank
    assert set(held_kv) == set(range(c.num_kv_heads))


def test_a_model_that_does_not_split_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match="tensor_parallel_size 3 must divide the model's 4 attention heads"):
        TensorParallel(0, 3).local_config(TINY_CONFIG)
