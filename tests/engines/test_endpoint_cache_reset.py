"""`endpoint` resets the server's prefix cache between points by probing the known reset paths; where none
answers, every output says "warm cache"; after a reset, a hit rate above the oracle's is a named breach.

The server is the measurement instrument with a perfect prefix cache of its own: each prompt's cached tokens are
its longest prefix (in 16-token blocks) sent since the last reset, as a real engine with an unbounded cache
reports them. Reset routes copy the engines' answers: vLLM's POST /reset_prefix_cache ({"success": true}),
SGLang's POST /flush_cache (200 text)."""

from __future__ import annotations

import contextlib
import json

import matplotlib.axes
import pandas as pd
import pytest
from aiohttp import web

from kvbench.cli.main import main
from kvbench.harness.instrument import InstrumentBehaviour, make_app
from kvbench.measure.report import write_plots
from kvbench.measure.run_folder import read_entries

from ..harness.instrument_fixture import app_in_thread

BLOCK = 16


class PrefixCache:
    """Blocks of prompts seen since the last reset; `forget` makes a reset that empties nothing (a liar)."""

    def __init__(self, forget: bool = True) -> None:
        self.blocks: set[tuple[int, ...]] = set()
        self.forget = forget
        self.resets = 0

    def behaviour(self, index: int, body: dict) -> InstrumentBehaviour:
        prompt = body.get("prompt") or []
        cached = 0
        while cached + BLOCK <= len(prompt) and tuple(prompt[: cached + BLOCK]) in self.blocks:
            cached += BLOCK
        self.blocks.update(tuple(prompt[:end]) for end in range(BLOCK, len(prompt) + 1, BLOCK))
        return InstrumentBehaviour(first_token_ms=5, chunk_interval_ms=1, cached_tokens=min(cached, len(prompt) - 1))

    def reset(self) -> None:
        self.resets += 1
        if self.forget:
            self.blocks.clear()


@contextlib.contextmanager
def cache_server(cache: PrefixCache, reset_route: str | None):
    """The instrument with `cache`, and `reset_route` ("vllm", "sglang" or None), in a thread of its own."""
    app = make_app(cache.behaviour)

    async def vllm_reset(request):
        cache.reset()
        return web.json_response({"success": True})

    async def sglang_flush(request):
        cache.reset()
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details.")

    if reset_route == "vllm":
        app.router.add_post("/reset_prefix_cache", vllm_reset)
    elif reset_route == "sglang":
        app.router.add_post("/flush_cache", sglang_flush)
    with app_in_thread(web.AppRunner(app, access_log=None)) as url:
        yield url


def _sweep(url: str, out, *flags: str) -> int:
    """The issue's endpoint sweep: concurrency 2 then 4, the same sessions at each point."""
    config = out.parent / f"{out.name}.yaml"
    config.write_text(
        f"engines: [{{engine: endpoint, settings: {{url: '{url}', metrics_path: null}}}}]\n"
        "workloads: [{name: rag-chat-mini, num_sessions: 3}]\n"
        "loads: [{concurrency: 2}, {concurrency: 4}]\n"
        "client: {max_lag_ms: 1000}\n"
    )  # the server shares this process: its lag is not the subject
    return main(["run", str(config), "--out", str(out), *flags])


def _entries(out):
    return json.loads((out / "summary.json").read_text())["runs"]


@pytest.mark.parametrize("route", ["vllm", "sglang"])
def test_the_known_reset_path_is_found_and_used_before_every_point(tmp_path, route):
    cache = PrefixCache()
    with cache_server(cache, route) as url:
        assert _sweep(url, tmp_path / "run") == 0
    entries = _entries(tmp_path / "run")
    assert [entry["cache_reset"] for entry in entries] == [True, True] and cache.resets == 2
    for entry in entries:
        rates = entry["summary"]["overall"]["cache"]
        assert entry["valid"] and entry["cache"] == "reset"
        assert rates["cache_hit_rate"] <= rates["oracle_hit_rate"] + 1e-9  # the second point starts cold too
    assert (
        entries[0]["engine_description"]["reset_path"]
        == {"vllm": "/reset_prefix_cache", "sglang": "/flush_cache"}[route]
    )


def test_without_a_reset_path_every_output_says_warm_cache(tmp_path, capsys):
    cache = PrefixCache()
    with cache_server(cache, None) as url:
        code = _sweep(url, tmp_path / "run")
    console = capsys.readouterr().out
    out = tmp_path / "run"
    first, second = _entries(out)
    assert first["cache_reset"] is False and second["cache"] == "warm cache"
    hit = second["summary"]["overall"]["cache"]
    assert hit["cache_hit_rate"] > hit["oracle_hit_rate"] + 0.1  # the 98.6% against 55.5%
    assert second["valid"], second["invalid_reasons"]  # legitimate for a warm cache: labelled, not invalid
    assert code == 0
    frame = pd.read_csv(out / "summary.csv")
    assert set(frame["cache"]) == {"warm cache"}
    summary_md = (out / "summary.md").read_text()
    assert "| warm cache |" in summary_md and "no cache reset path answered" in summary_md
    assert "warm cache" in console
    titles = []  # the plots' titles, recorded where they are drawn
    original = matplotlib.axes.Axes.set_title

    def record(self, label, *args, **kwargs):
        titles.append(label)
        return original(self, label, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(matplotlib.axes.Axes, "set_title", record)
        write_plots(out, read_entries(out), {"endpoint": [1.0, 2.0]})
    assert titles and all(title.endswith("(warm cache)") for title in titles), titles


def test_after_a_reset_that_empties_nothing_the_hit_over_the_oracle_is_named(tmp_path):
    cache = PrefixCache(forget=False)  # answers the reset, keeps every block
    with cache_server(cache, "vllm") as url:
        _sweep(url, tmp_path / "run")
    first, second = _entries(tmp_path / "run")
    assert first["valid"] and second["cache_reset"] is True
    assert second["valid"] is False
    (reason,) = second["invalid_reasons"]
    assert "exceeds the oracle's" in reason and "+ 2%" in reason and "after a cache reset" in reason


def test_reset_path_null_never_resets(tmp_path):
    cache = PrefixCache()
    with cache_server(cache, "vllm") as url:
        config = tmp_path / "c.yaml"
        config.write_text(
            f"engines: [{{engine: endpoint, settings: {{url: '{url}', reset_path: null, metrics_path: null}}}}]\n"
            "workloads: [{name: rag-chat-mini, num_sessions: 2}]\nclient: {max_lag_ms: 1000}\n"
        )
        assert main(["run", str(config), "--out", str(tmp_path / "run")]) == 0
    assert cache.resets == 0 and _entries(tmp_path / "run")[0]["cache"] == "warm cache"
