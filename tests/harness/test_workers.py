"""Several load workers (`kvbench run --workers N`) against the measurement instrument: the same requests,
prompts and timing as one worker, one requests.jsonl, and a dead worker that fails the point loudly."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from kvbench.harness.client import EndpointConfig
from kvbench.harness.instrument import InstrumentBehaviour
from kvbench.harness.loadgen import LoadGenerator
from kvbench.harness.workers import ProcessPool, run_on_workers, worker_cpus
from kvbench.measure.metrics import itl_ms, summarize, ttft_ms
from kvbench.measure.records import RecordWriter, read_records
from kvbench.measure.schedule import LoadSpec

from .instrument_fixture import serving
from .test_loadgen import workload
from .timing import EARLY_MS

# 30 ms to the first token, then 25 ms per token (105 ms in all).
TIMING = InstrumentBehaviour(first_token_ms=30.0, chunk_interval_ms=25.0, first_token_id=700)


def play(behaviour, wl, load, workers, path=None, pool=None, on_record=None, max_lag_ms=10.0):
    """Records and the prompts the instrument received, for one run on `workers` workers (1: in-process)."""

    async def go():
        async with serving(behaviour) as (url, log):
            generator = LoadGenerator(
                EndpointConfig(base_url=url, model="m"), load, run_id="test", max_lag_ms=max_lag_ms
            )
            if workers == 1:
                return await generator.run(wl), log
            with RecordWriter(path) as writer:
                result = await asyncio.to_thread(run_on_workers, generator, wl, workers, writer, on_record, pool=pool)
            return result, log

    return asyncio.run(go())


def by_request(records):
    return {(record.session_id, record.turn): record for record in records}


def test_two_workers_send_the_same_requests_with_the_same_prompts_and_timing_as_one(tmp_path):
    wl = workload(sessions=4, turns=3, max_tokens=4, think=0.01)
    load = LoadSpec(concurrency=4)
    one, one_log = play(TIMING, wl, load, workers=1)
    two, two_log = play(TIMING, wl, load, workers=2, path=tmp_path / "requests.jsonl")

    assert (
        by_request(two.records).keys()
        == by_request(one.records).keys()
        == {(f"s{s}", t) for s in range(4) for t in range(3)}
    )
    # Each session's turns in order, each carrying the real answer before it: every prompt the instrument got
    # from two workers is one it got from one worker, and a session's prompts grow by answer + next user turn.
    assert sorted(map(tuple, (body["prompt"] for body in two_log.bodies))) == sorted(
        map(tuple, (body["prompt"] for body in one_log.bodies))
    )
    answer = [700, 701, 702, 703]
    for session in wl.sessions:
        records = sorted((r for r in two.records if r.session_id == session.session_id), key=lambda r: r.sent_ns)
        assert [r.turn for r in records] == [0, 1, 2]
        assert all(r.answer_tokens == answer for r in records)
        lengths = [r.prompt_len_sent for r in records]
        assert np.diff(lengths).tolist() == [len(answer) + len(session.turns[k].user_tokens) for k in (1, 2)]
    # The driver's oracle: later turns reuse exactly what one worker's does; which first turn reached the
    # shared context first depends on completion order, so first turns agree as a multiset.
    ones, twos = by_request(one.records), by_request(two.records)
    assert all(twos[key].reusable_tokens == ones[key].reusable_tokens for key in ones if key[1] > 0)
    assert Counter(r.reusable_tokens for r in two.records if r.turn == 0) == Counter(
        r.reusable_tokens for r in one.records if r.turn == 0
    )
    # The injected timing, measured on each worker's clock: its exact side for every request (the instrument
    # sleeps the injected time before each chunk), TTFT within the answer, one gap per token after the first.
    # How late it is read depends on how loaded the 2 shared cores are (here three processes and the
    # instrument): measured, not asserted, by `benchmarks/timing_overhead.py --workers 2`.
    assert all(record.ok for record in two.records)
    for record in two.records:
        assert record.sent_ns < record.first_token_ns <= record.done_ns
        assert ttft_ms(record) >= 30.0 - EARLY_MS
        assert (record.done_ns - record.sent_ns) / 1e6 >= 30.0 + 3 * 25.0 - EARLY_MS
        assert len(itl_ms(record)) == 3
    summary = summarize(two.records)
    assert summary.output_tokens == 12 * 4
    # Every record landed in the one file as it finished; the self-check has both workers.
    assert by_request(read_records(tmp_path / "requests.jsonl")).keys() == twos.keys()
    assert len(two.client.workers) == 2 and two.client.start_spread_ms is not None
    assert two.aborted is None


def test_a_killed_worker_fails_the_point_names_itself_and_every_finished_record_is_on_disk(tmp_path):
    wl = workload(sessions=4, turns=4, max_tokens=2, think=0.05)
    pool = ProcessPool()
    killed = []

    def kill_worker_1(record):  # sessions are dealt round-robin: s1 and s3 are worker 1's
        if record.session_id == "s1" and not killed:
            killed.append(pool.pids[1])
            os.kill(killed[0], signal.SIGKILL)

    result, _ = play(
        TIMING,
        wl,
        LoadSpec(concurrency=4),
        workers=2,
        path=tmp_path / "requests.jsonl",
        pool=pool,
        on_record=kill_worker_1,
    )
    assert result.aborted is not None and f"load worker 1 (pid {killed[0]}) died" in result.aborted
    on_disk = by_request(read_records(tmp_path / "requests.jsonl"))
    assert on_disk.keys() == by_request(result.records).keys()
    # Worker 0 played its sessions to the end; worker 1's stopped when it was killed.
    assert {(s, t) for s in ("s0", "s2") for t in range(4)} <= on_disk.keys()
    assert sum(1 for s, _ in on_disk if s in ("s1", "s3")) < 8


def test_the_point_is_invalid_when_a_worker_falls_behind_and_each_worker_has_its_own_check(tmp_path):
    # A lag limit no process can keep (1 ns): every worker falls behind, and says so in its own check. The bound
    # is relative too (5% of TTFT p50, client_check), so the instrument answers at once: that share stays far below
    # what any event loop lags.
    instant = InstrumentBehaviour(first_token_ms=0.0, chunk_interval_ms=0.0, first_token_id=700)
    result, _ = play(
        instant,
        workload(sessions=4, max_tokens=2),
        LoadSpec(rate=50.0),
        workers=2,
        path=tmp_path / "requests.jsonl",
        max_lag_ms=1e-6,
    )
    assert not result.client.valid and "lag p99" in result.client.reason
    assert len(result.client.workers) == 2
    assert all(
        not worker.valid and worker.schedule_lag_ms is not None and worker.loop_lag_ms is not None
        for worker in result.client.workers
    )
    assert result.client.schedule_lag_ms.n == 4  # pooled over both workers' requests


@pytest.mark.slow
def test_without_ray_kvbench_imports_and_run_ray_says_how_to_install_it(tmp_path):
    # `ray` made unimportable, as on a base install; --workers needs nothing of it.
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import kvbench.harness.runner, kvbench.harness.ray_cluster, kvbench.cli.main\n"
        "sys.exit(kvbench.cli.main.main(['run', '--url', 'http://127.0.0.1:9', '--ray', '--out', sys.argv[1]]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "out")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'kvbench[ray]'" in lines[0]
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_workers_get_a_cpu_each_only_where_there_are_plenty():
    assert worker_cpus(2, list(range(16))) == [15, 14]
    assert worker_cpus(4, list(range(8))) == [7, 6, 5, 4]
    assert worker_cpus(2, [0, 1]) == [None, None]  # this 2-core machine: the OS places them
    assert worker_cpus(3, [0, 1, 2, 3, 4]) == [None, None, None]
