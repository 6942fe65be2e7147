"""Our engine (the tiny random model, in process) under the preemption pattern that broke the core: requests
sharing a prefix, arriving while others decode, on a device KV tier far too small for them, so that
sequences are preempted after generating tokens and readmitted onto their own cached generated pages.
After every step every page is counted once per holder (`Scheduler.check_integrity`), and each request's
greedy tokens are the ones it gets on a roomy tier (a page shared by two writers would change them)."""

from __future__ import annotations

import pytest

from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model

from .tiers_fixtures import greedy, make_engine, tokens

PS = 4
SHARED = list(range(300, 312))  # 3 pages every prompt begins with
# (request, own prompt tokens after the shared ones, tokens to generate, the step it arrives at)
REQUESTS = [(f"r{i}", list(range(400 + 10 * i, 405 + 10 * i + i % 3)), 14 + 3 * (i % 4), 2 * i) for i in range(8)]


@pytest.fixture(scope="module")
def loaded():
    return tiny_loaded_model(seed=5)


def play(engine: Engine) -> tuple[dict[str, list[int]], int]:
    """Every request to the end, adding each at its step; the tokens per request and how many times a
    running request was preempted. Checks every page's holders after every step."""
    due = {}
    for rid, own, max_tokens, step in REQUESTS:
        due.setdefault(step, []).append(greedy(rid, SHARED + own, max_tokens))
    outputs: dict[str, list] = {rid: [] for rid, *_ in REQUESTS}
    step = preempted = 0
    while engine.has_work() or any(s >= step for s in due):
        for request in due.get(step, []):
            engine.add(request)
        running = {seq.request.request_id for seq in engine.scheduler._running}
        done = set()
        for output in engine.step():
            outputs[output.request_id].append(output)
            if output.finish_reason is not None:
                done.add(output.request_id)
        engine.scheduler.check_integrity()
        preempted += len(running - done - {seq.request.request_id for seq in engine.scheduler._running})
        step += 1
        assert step < 5000, "the engine did not finish"
    return {rid: tokens(out) for rid, out in outputs.items()}, preempted


def test_heavy_preemption_keeps_every_page_counted_and_greedy_tokens_unchanged(loaded):
    roomy, roomy_preempted = play(make_engine(loaded, page_size=PS, kv_capacity=4096))
    # 10 pages of 4 tokens: one sequence of 17-20 prompt and up to 23 generated tokens needs up to 11
    tight, tight_preempted = play(make_engine(loaded, page_size=PS, kv_capacity=12 * PS, max_step_tokens=24))
    assert roomy_preempted == 0 and tight_preempted >= 10
    assert tight == roomy
    assert all(len(roomy[rid]) == max_tokens for rid, _, max_tokens, _ in REQUESTS)
