"""Normal requests' TTFT under a bounded hostile load, beside a clean run, on loopback (issue 28).

    python benchmarks/hostile_load_bench.py [--source main=/path/to/main/checkout] [--source branch=.]
        [--normal 24] [--concurrency 4] [--hostile 5] [--max-model-len 8192]

For each source tree (a kvbench checkout: `git stash` or `git archive main` gives the before), starts
`kvbench serve --model tiny-random` from it on a free loopback port and runs two loads:

- clean: `--normal` streaming text completions (a ~200-character prompt, 8 tokens), `--concurrency` at a time;
- mixed: the same normal requests while `--hostile` clients loop, each sending in turn a chat of 100,000
  one-character messages, a chat of 2000 messages just under what the context holds (tokenised, then
  refused as too long), a body nested 100,000 deep, a streaming request whose client leaves at once, and a
  100 kB Authorization header. The hostile clients stop when the normal requests are done (bounded).

Prints TTFT p50/p99 of the normal requests (first chunk carrying a token - sent; linear-interpolation
percentiles, numpy's default), how many normal requests failed, and the hostile requests' statuses. Timings
on a shared machine are noisy: compare rows measured back to back.

    python benchmarks/hostile_load_bench.py --issue46 [--source before=/tmp/before] [--source after=.]

runs issue 46's cases instead (`hostile_cases.py`): each engine attack beside a normal "hello world"
request (its p50, worst and worst / idle), then each command line's outcome, seconds and peak resident MB.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

from kvbench.harness.sse import SSEParser

PROMPT = ("The quick brown fox jumps over the lazy dog while the cache keeps every page it can. " * 3)[:200]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(source: Path, port: int, max_model_len: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(source), "OMP_WAIT_POLICY": "PASSIVE"}
    command = [
        sys.executable,
        "-m",
        "kvbench.engines.kvengine.server.main",
        "--model",
        "tiny-random",
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--kv-capacity",
        str(4 * max_model_len),
        "--threads",
        "1",
    ]
    return subprocess.Popen(command, env=env, cwd=source, stdout=log.open("wb"), stderr=subprocess.STDOUT)


async def wait_healthy(session: aiohttp.ClientSession, base: str, process: subprocess.Popen) -> None:
    for _ in range(1200):
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}; see its log")
        try:
            async with session.get(base + "/health") as reply:
                if reply.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise SystemExit("the server did not become healthy in 120 s")


async def normal_request(session: aiohttp.ClientSession, base: str) -> float | None:
    """TTFT in ms of one streaming completion; None when it failed."""
    body = {
        "model": "default",
        "prompt": PROMPT,
        "max_tokens": 8,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }  # the tiny model's ids mostly decode to no text
    sent = time.perf_counter_ns()
    try:
        async with session.post(base + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=600)) as reply:
            if reply.status != 200:
                return None
            parser, first = SSEParser(), None
            async for chunk in reply.content.iter_any():
                for payload in parser.feed(chunk):
                    if payload == "[DONE]":
                        continue
                    choices = json.loads(payload).get("choices") or [{}]
                    if first is None and choices[0].get("token_ids"):
                        first = time.perf_counter_ns()
            return None if first is None else (first - sent) / 1e6
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None


def hostile_bodies(max_model_len: int) -> list[tuple[str, bytes]]:
    compact = {"separators": (",", ":")}
    flood = {"model": "default", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}] * 100_000}
    per_message = max_model_len * 64 // 2000 - 40  # just under the characters the context is given, templated
    near = {"model": "default", "max_tokens": 2, "messages": [{"role": "user", "content": "z" * per_message}] * 2000}
    deep = 100_000
    return [
        ("chat-100k-messages", json.dumps(flood, **compact).encode()),
        ("chat-2000-long", json.dumps(near, **compact).encode()),
        ("deep-body", b"[" * deep + b"]" * deep),
    ]


async def hostile_client(
    session: aiohttp.ClientSession,
    base: str,
    port: int,
    bodies,
    stop: asyncio.Event,
    statuses: collections.Counter,
    offset: int,
) -> None:
    kinds = [*bodies, ("leaver", b""), ("huge-header", b"")]
    turn = offset
    while not stop.is_set():
        name, raw = kinds[turn % len(kinds)]
        turn += 1
        try:
            if name == "leaver":
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                body = json.dumps({"prompt": PROMPT, "max_tokens": 2000, "stream": True, "ignore_eos": True}).encode()
                writer.write(
                    b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                line = await asyncio.wait_for(reader.readline(), 600)
                writer.close()
                statuses[f"{name} {line.split(b' ')[1].decode() if line else 'closed'}"] += 1
                continue
            if name == "huge-header":
                headers = {"Authorization": "Bearer sk-" + "A" * 100_000}
                async with session.get(base + "/health", headers=headers) as reply:
                    statuses[f"{name} {reply.status}"] += 1
                continue
            path = "/v1/chat/completions" if name.startswith("chat") else "/v1/completions"
            async with session.post(
                base + path,
                data=raw,
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=600),
            ) as reply:
                await reply.read()
                statuses[f"{name} {reply.status}"] += 1
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, ValueError):
            statuses[f"{name} failed"] += 1


async def run_load(base: str, port: int, args, hostile: int) -> dict:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, max_line_size=1 << 20, max_field_size=1 << 20) as session:
        stop, statuses = asyncio.Event(), collections.Counter()
        bodies = hostile_bodies(args.max_model_len)
        attackers = [
            asyncio.create_task(hostile_client(session, base, port, bodies, stop, statuses, i)) for i in range(hostile)
        ]
        if attackers:
            await asyncio.sleep(1.0)  # the hostile load is under way before the first normal request
        queue = list(range(args.normal))
        ttfts: list[float | None] = []

        async def normal_worker() -> None:
            while queue:
                queue.pop()
                ttfts.append(await normal_request(session, base))

        await asyncio.gather(*(normal_worker() for _ in range(args.concurrency)))
        stop.set()
        await asyncio.gather(*attackers)
    ok = [t for t in ttfts if t is not None]
    return {"ttft": ok, "failed": len(ttfts) - len(ok), "hostile": dict(sorted(statuses.items()))}


async def measure(label: str, source: Path, args) -> list[dict]:
    port = free_port()
    log = Path(args.log_dir) / f"hostile_bench_{label}.log"
    process = start_server(source, port, args.max_model_len, log)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            await wait_healthy(session, base, process)
        rows = []
        for load, hostile in (("clean", 0), ("mixed", args.hostile)):
            before = error_lines(log)
            result = await run_load(base, port, args, hostile)
            await asyncio.sleep(1.0)  # the server logs what the last clients did
            rows.append({"source": label, "load": load, **result, "log_errors": error_lines(log) - before})
        return rows
    finally:
        process.terminate()
        process.wait(30)


def error_lines(log: Path) -> int:
    return sum(" ERROR " in line for line in log.read_text(errors="replace").splitlines())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--source",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="a kvbench checkout to serve from (repeatable; default: this one, labelled 'this')",
    )
    parser.add_argument("--normal", type=int, default=24, help="normal requests per load")
    parser.add_argument("--concurrency", type=int, default=4, help="normal requests in flight")
    parser.add_argument("--hostile", type=int, default=5, help="hostile clients in the mixed load")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--log-dir", default="/tmp")
    parser.add_argument("--issue46", action="store_true", help="issue 46's engine and command-line cases")
    parser.add_argument("--cli-only", action="store_true", help="with --issue46: the command lines only")
    args = parser.parse_args()
    sources = [item.split("=", 1) for item in args.source] or [["this", str(Path(__file__).resolve().parents[1])]]
    if args.issue46:
        return issue46(sources, args)
    rows = []
    for label, folder in sources:
        rows += asyncio.run(measure(label, Path(folder).resolve(), args))
    print("| source | load | normal ok | failed | TTFT p50 ms | TTFT p99 ms | server ERROR lines | hostile statuses |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        ttft = np.array(row["ttft"])
        p50, p99 = (f"{np.percentile(ttft, q):,.0f}" if ttft.size else "n/a" for q in (50, 99))
        hostile = ", ".join(f"{k}: {v}" for k, v in row["hostile"].items()) or "-"
        print(
            f"| {row['source']} | {row['load']} | {ttft.size} | {row['failed']} | {p50} | {p99} | "
            f"{row.get('log_errors', 'n/a')} | {hostile} |"
        )


def issue46(sources: list[list[str]], args) -> None:
    import hostile_cases as cases

    this = Path(__file__).resolve().parents[1]
    files = cases.make_data(Path(args.log_dir) / "hostile46-data")
    engine_lines, cli_lines = [], []
    for label, folder in sources:
        source = Path(folder).resolve()
        port = free_port()
        process = (
            None
            if args.cli_only
            else start_server(source, port, args.max_model_len, Path(args.log_dir) / f"hostile46_{label}.log")
        )
        base = f"http://127.0.0.1:{port}"
        try:

            async def engine() -> list[dict]:
                async with aiohttp.ClientSession() as session:
                    await wait_healthy(session, base, process)
                return await cases.engine_rows(base, port)

            engine_lines += cases.engine_table(label, asyncio.run(engine())) if process else []
        finally:
            if process is not None:
                process.terminate()
                process.wait(30)
        instrument_port = free_port()
        instrument = subprocess.Popen(
            [sys.executable, "-m", "kvbench.harness.instrument", "--port", str(instrument_port)],
            env={**os.environ, "PYTHONPATH": str(this)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(2)
            argvs = cases.cli_cases(
                f"http://127.0.0.1:{instrument_port}",
                files,
                this / "tests" / "data" / "datasets" / "tokenizer",
                free_port(),
            )
            for name, argv in argvs.items():
                row = cases.run_cli(source, argv, Path(args.log_dir) / f"hostile46-{label}" / str(len(cli_lines)))
                rss = f"{row['rss_mb']:,.0f}" if row["rss_mb"] is not None else "n/a"
                cli_lines.append(f"| {label} | {name} | {row['outcome']} | {row['seconds']:.1f} | {rss} |")
                print(cli_lines[-1], flush=True)
        finally:
            instrument.kill()
            instrument.wait()
    print("| source | engine case | normal requests | p50 ms | worst ms | worst / idle p50 | attack saw |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(engine_lines))
    print("\n| source | command line | outcome | s | peak RSS MB |\n|---|---|---|---|---|")
    print("\n".join(cli_lines))


if __name__ == "__main__":
    main()
