"""How long the SSE parser takes for one large event fed in network-sized chunks (the event loop is blocked
that long). Run with PYTHONPATH pointing at the kvbench tree to measure:

    PYTHONPATH=. python benchmarks/sse_parse.py
    PYTHONPATH=/tmp/main python benchmarks/sse_parse.py      # another version's parser
"""

from __future__ import annotations

import time

from kvbench.harness.sse import SSEParser

CHUNK = 64 * 1024


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


def main() -> None:
    print("| event MB | parse s | outcome |")
    print("|---|---|---|")
    for megabytes in (1, 5, 10, 20):
        seconds, outcome = parse_seconds(megabytes * 1_000_000)
        print(f"| {megabytes} | {seconds:.3f} | {outcome} |", flush=True)


if __name__ == "__main__":
    main()
