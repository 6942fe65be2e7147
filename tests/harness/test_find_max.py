"""The SLA search: against synthetic verdicts with a known answer, and on real runs against the instrument
made to slow down past a known number of requests in flight (the knee)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import pytest
import yaml
from aiohttp import web

from kvbench.cli.main import main
from kvbench.harness.find_max import FIND_MAX_JSON, Probe, search_max
from kvbench.harness.instrument import InstrumentBehaviour, make_app

from .instrument_fixture import free_port


def _verdicts(knee, tried):
    def evaluate(load):
        tried.append(load)
        return Probe(load, load <= knee, {"ttft_p99_ms": 10.0 if load <= knee else 900.0}, 10, 0, (), "")

    return evaluate


@pytest.mark.parametrize(
    ("start", "knee", "answer", "missed"), [(1, 6, 6, 7), (1, 1, 1, 2), (16, 5, 5, 6), (4, 40, 40, 41)]
)
def test_concurrency_search_finds_the_knee_exactly(start, knee, answer, missed):
    tried = []
    search = search_max(_verdicts(knee, tried), start, integer=True, max_probes=20)
    assert (search.answer, search.missed_at) == (answer, missed)
    assert [probe.load for probe in search.probes] == tried and len(set(tried)) == len(tried)  # each once, reported


def test_rate_search_brackets_the_knee_within_the_tolerance():
    search = search_max(_verdicts(7.3, []), 1.0, integer=False, rel_tol=0.05, max_probes=20)
    assert search.answer <= 7.3 < search.missed_at <= search.answer * 1.05


def test_the_search_stops_at_max_probes_and_reports_what_it_has():
    search = search_max(_verdicts(1000, []), 1, integer=True, max_probes=4)
    assert len(search.probes) == 4 and search.answer == 8 and search.missed_at is None


def test_a_load_that_meets_above_one_that_misses_is_reported():
    def bumpy(load):
        return Probe(load, load != 2, {}, 1, 0, (), "")

    search = search_max(bumpy, 1, integer=True, max_probes=6)
    assert any("load 2 misses the SLO but" in finding for finding in search.non_monotone)


class Knee:
    """The instrument's timing as a function of load: fast while fewer than `capacity` other requests are in
    flight, slow past it (each request's end is known when it arrives: first token plus its chunks)."""

    def __init__(self, capacity, fast_ms=15.0, slow_ms=600.0, interval_ms=3.0):
        self.capacity, self.fast_ms, self.slow_ms, self.interval_ms = capacity, fast_ms, slow_ms, interval_ms
        self.ends: list[float] = []
        self.lock = threading.Lock()

    def __call__(self, index, body):
        now = time.monotonic()
        with self.lock:
            self.ends = [end for end in self.ends if end > now]
            first = self.fast_ms if len(self.ends) < self.capacity else self.slow_ms
            # the last chunk leaves at first + (tokens - 1) x interval; a next request arrives after it
            self.ends.append(now + (first + (body["max_tokens"] - 1) * self.interval_ms - 2) / 1e3)
        return InstrumentBehaviour(first_token_ms=first, chunk_interval_ms=self.interval_ms)


@contextlib.contextmanager
def serving_in_a_thread(behaviour):
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(make_app(behaviour), access_log=None, shutdown_timeout=0.5)
    loop.run_until_complete(runner.setup())
    port = free_port()
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.run_until_complete(runner.cleanup())
        loop.close()


def test_find_max_concurrency_on_real_runs_finds_the_instruments_knee(tmp_path, capsys):
    """Capacity 3: concurrency 3 keeps TTFT at 15 ms, 4 makes every fourth request wait 600 ms, so p99 misses
    300 ms; the search probes 1, 2, 4 and 3, then 8 (the miss must hold above it), and answers 3 in [3, 4)."""
    with serving_in_a_thread(Knee(capacity=3)) as url:
        config = tmp_path / "knee.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "engines": [{"engine": "endpoint", "settings": {"url": url, "model": "instrument"}}],
                    "workloads": [
                        {"name": "random", "num_sessions": 16, "overrides": {"input_len": 8, "output_len": 4}}
                    ],
                    # the instrument shares this process: its thread makes the client's loop lag, which is not the subject
                    "stop": {"num_requests": 16},
                    "client": {"max_lag_ms": 2000},
                }
            )
        )
        out = tmp_path / "search"
        code = main(["run", str(config), "--find-max", "concurrency", "--slo", "ttft_p99_ms=300", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    result = json.loads((out / FIND_MAX_JSON).read_text())
    assert (result["answer"], result["missed_at"]) == (3, 4)
    assert sorted(probe["load"] for probe in result["probes"]) == [1, 2, 3, 4, 8]
    assert result["non_monotone"] == []
    assert all((out / "probes" / name).is_dir() for name in ("01-concurrency-1", "04-concurrency-3"))
    assert "highest concurrency meeting the SLO: 3" in printed and printed.count("probe concurrency") == 5


def test_the_main_jobs_two_settings_are_refused_in_one_line_naming_the_fix(capsys):
    assert main(["run", "--find-max", "concurrency", "--slo", "ttft_p99_ms=300"]) == 2
    err = capsys.readouterr().err
    assert "searches one engine setting" in err and "--set kv_dtype=fp8_e4m3" in err and len(err.splitlines()) == 1


def test_the_answer_never_exceeds_the_most_requests_measured_in_flight():
    # A 10-session workload: every concurrency meets the SLO, but no probe ever had more than 10 in flight.
    def evaluate(load):
        return Probe(load, True, {"ttft_p99_ms": 10.0}, 34, 0, (), "", peak_in_flight=min(int(load), 10))

    search = search_max(evaluate, 1, integer=True, max_probes=6)
    assert search.answer == 10 and "at most 10 requests were ever in flight" in search.capped
    assert max(probe.load for probe in search.probes) > 10  # it offered more; the answer is what was measured


def test_a_search_stopped_by_the_clients_lag_is_client_bound_not_a_missed_slo():
    lagging = ("client lag: event-loop lag p99 12.00 ms > 10 ms",)
    search = search_max(lambda load: Probe(load, False, {"ttft_p99_ms": 51.0}, 34, 0, lagging, ""), 4, integer=True)
    assert search.answer is None and search.client_bound and all(probe.client_bound for probe in search.probes)
    slow = search_max(lambda load: Probe(load, False, {"ttft_p99_ms": 900.0}, 34, 0, (), ""), 4, integer=True)
    assert slow.answer is None and not slow.client_bound
    both = Probe(1, False, {}, 1, 0, (*lagging, "3/10 requests failed (limit 10%): http: 500"), "")
    assert not both.client_bound  # failed requests are the engine's: not the client alone
