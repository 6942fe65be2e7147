"""How long the SSE parser takes for one large event fed in network-sized chunks (the event loop is blocked
that long), and the CPU one ordinary answer costs on the client's parse path (10 events, one read each:
SSE parse, [DONE] found, each payload decoded and checked). Run with PYTHONPATH pointing at the kvbench tree:

    PYTHONPATH=. python benchmarks/sse_parse.py
    PYTHONPATH=/tmp/main python benchmarks/sse_parse.py      # another version's parser
"""

from __future__ import annotations

import json
import time

from kvbench.harness.sse import SSEParser
from kvbench.harness.stream_answer import API_COMPLETIONS, AnswerLimits, AnswerReader

CHUNK = 64 * 1024
ANSWER_TOKENS = 8


def parse_seconds(event_bytes: int) -> tuple[float, str]:
    body = b"data: " + b"x" * event_bytes + b"\n\n"
    parser = SSEParser()
    start = time.perf_counter()
    outcome = "parsed"
    try:
        for offset in range(0, len(body), CHUNK):
            parser.feed(body[offset : offset + CHUNK])
    except ValueError as exc:  # the bounded parser refuses an event past its bound
        outcome = f"refused: {exc}"
    return time.perf_counter() - start, outcome


def answer_events() -> list[bytes]:
    """An ordinary completions answer as vLLM streams it: a token per event, usage last, then [DONE]."""
    token = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "text": " a", "token_ids": [1001], "logprobs": None, "finish_reason": None}],
        "usage": None,
    }
    usage = {"prompt_tokens": 40, "completion_tokens": ANSWER_TOKENS, "prompt_tokens_details": {"cached_tokens": 0}}
    last = {**token, "choices": [], "usage": usage}
    events = [json.dumps(token).encode()] * ANSWER_TOKENS + [json.dumps(last).encode(), b"[DONE]"]
    return [b"data: " + event + b"\n\n" for event in events]


def answer_cpu_us(answers: int = 20_000) -> float:
    """CPU microseconds per answer on the parse path, as this version's client goes through it."""
    events = answer_events()
    try:
        from kvbench.harness.sse import is_done  # the fast path: payloads as bytes
    except ImportError:
        is_done = None
    start = time.process_time()
    for _ in range(answers):
        parser, reader = SSEParser(), AnswerReader(API_COMPLETIONS, AnswerLimits(ANSWER_TOKENS))
        for arrival, event in enumerate(events):
            if is_done is not None:
                payloads = [p for p in parser.feed_bytes(event) if not is_done(p)]
            else:
                payloads = [p for p in parser.feed(event) if p.strip() != "[DONE]"]
            for payload in payloads:
                assert reader.take(payload, arrival) is None
        assert reader.finish() is None
    return (time.process_time() - start) / answers * 1e6


def main() -> None:
    print("| event MB | parse s | outcome |")
    print("|---|---|---|")
    for megabytes in (1, 5, 10, 20):
        seconds, outcome = parse_seconds(megabytes * 1_000_000)
        print(f"| {megabytes} | {seconds:.3f} | {outcome} |", flush=True)
    print(f"\n| one {ANSWER_TOKENS}-token answer (10 events) | parse path CPU us |\n|---|---|")
    print(f"| best of 3 | {min(answer_cpu_us() for _ in range(3)):.1f} |")


if __name__ == "__main__":
    main()
