"""The OpenAI-compatible server: official client, streaming, usage, logprobs, errors, metrics."""

from __future__ import annotations

import concurrent.futures
import json
import urllib.request

import openai
import pytest

from kvbench.engines.kvengine.runtime.engine import Engine
from kvbench.engines.kvengine.runtime.tiny import tiny_loaded_model
from kvbench.engines.kvengine.settings.config import EngineConfig
from kvbench.engines.prometheus import parse_samples

from .server_fixture import serving

PROMPT = list(range(300, 380))


@pytest.fixture(scope="module")
def url():
    engine = Engine(EngineConfig(kv_capacity=4096, max_model_len=512, served_model_name="tiny"), tiny_loaded_model(5))
    with serving(engine) as base:
        yield base


@pytest.fixture
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def post(url, path, body):
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_official_client_streams_completions_with_usage_and_cached_tokens(client):
    def stream():
        chunks = list(
            client.completions.create(
                model="tiny",
                prompt=PROMPT,
                max_tokens=6,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True, "return_token_ids": True},
            )
        )
        ids = [
            token
            for chunk in chunks
            if chunk.choices
            for token in (chunk.choices[0].model_extra.get("token_ids") or [])
        ]
        usage = chunks[-1].usage
        return ids, usage

    first_ids, first_usage = stream()
    second_ids, second_usage = stream()
    assert len(first_ids) == 6 and first_usage.completion_tokens == 6 and first_usage.prompt_tokens == 80
    assert second_ids == first_ids
    assert second_usage.prompt_tokens_details.cached_tokens == 64


def test_official_client_chat_stream_and_non_stream_agree(client):
    messages = [{"role": "user", "content": "hello there"}]
    whole = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
    )
    pieces = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in pieces if chunk.choices)
    assert text == whole.choices[0].message.content
    assert whole.usage.completion_tokens == 8


def test_echo_with_logprobs_scores_the_prompt_like_lm_eval_asks(url):
    status, body = post(
        url,
        "/v1/completions",
        {"model": "tiny", "prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 1, "temperature": 0},
    )
    assert status == 200
    logprobs = body["choices"][0]["logprobs"]
    assert len(logprobs["token_logprobs"]) == len(PROMPT)
    assert logprobs["token_logprobs"][0] is None and all(v <= 0 for v in logprobs["token_logprobs"][1:])
    assert all(len(top) == 1 for top in logprobs["top_logprobs"][1:])
    assert body["usage"]["completion_tokens"] == 0


def test_stop_string_ends_the_text_before_it(client):
    base = client.completions.create(
        model="tiny", prompt="abc", max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    text = base.choices[0].text
    # random weights emit arbitrary bytes: stop on the first printable ASCII character after the first one
    stop = next(char for char in text[1:] if 32 < ord(char) < 127)
    cut = client.completions.create(
        model="tiny", prompt="abc", max_tokens=12, temperature=0, stop=[stop], extra_body={"ignore_eos": True}
    )
    assert cut.choices[0].text == text[: text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_concurrent_requests_all_finish(client):
    def one(index):
        return client.completions.create(
            model="tiny",
            prompt=[300 + index] * (20 + index),
            max_tokens=5,
            temperature=0,
            extra_body={"ignore_eos": True},
        )

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(12)))
    assert all(result.usage.completion_tokens == 5 for result in results)


@pytest.mark.parametrize(
    "body, field",
    [
        ({"prompt": [300] * 600, "max_tokens": 4}, "context"),
        ({"prompt": [300] * 10, "max_tokens": -1}, "max_tokens"),
        ({"prompt": "x", "temperature": "hot"}, "temperature"),
        ({"prompt": [], "max_tokens": 4}, "prompt"),
        ({"prompt": [300], "n": 2}, "n"),
    ],
)
def test_bad_requests_get_a_400_naming_the_problem(url, body, field):
    status, reply = post(url, "/v1/completions", {"model": "tiny", **body})
    assert status == 400
    assert field in reply["error"]["message"]
    assert reply["error"]["type"] == "invalid_request_error"


def test_unknown_model_is_404_and_models_lists_ours(url, client):
    status, reply = post(url, "/v1/completions", {"model": "gpt-9", "prompt": "x"})
    assert status == 404 and "tiny" in reply["error"]["message"]
    assert [model.id for model in client.models.list().data] == ["tiny"]


def test_metrics_count_what_usage_reported_and_reset_clears_the_cache(url, client):
    def scrape():
        with urllib.request.urlopen(url + "/metrics") as reply:
            return parse_samples(reply.read().decode())

    before = scrape()
    prompt = list(range(400, 448))
    client.completions.create(model="tiny", prompt=prompt, max_tokens=2, temperature=0, extra_body={"ignore_eos": True})
    again = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=2, temperature=0, extra_body={"ignore_eos": True}
    )
    after = scrape()
    key = 'kvbench:prompt_tokens_cached_total{model_name="tiny"}'
    assert after[key] - before.get(key, 0) == again.usage.prompt_tokens_details.cached_tokens == 32
    status, body = post(url, "/reset_prefix_cache", {})
    assert status == 200 and body["freed_pages"] > 0
    cold = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=2, temperature=0, extra_body={"ignore_eos": True}
    )
    assert cold.usage.prompt_tokens_details.cached_tokens == 0


def test_api_key_is_required_when_set():
    engine = Engine(EngineConfig(kv_capacity=512), tiny_loaded_model(5))
    with serving(engine, api_key="sekret") as base:
        status, reply = post(base, "/v1/completions", {"prompt": "x", "max_tokens": 1})
        assert status == 401
        good = openai.OpenAI(base_url=base + "/v1", api_key="sekret", max_retries=0)
        assert good.completions.create(model="default", prompt="x", max_tokens=1).usage.completion_tokens == 1


def test_every_kv_dtype_the_serve_flags_accept_is_stored_by_the_model_at_its_size():
    import argparse

    from kvbench.engines.kvengine.core.kv_format import KV_DTYPES, KVDtype
    from kvbench.engines.kvengine.model import fp8
    from kvbench.engines.kvengine.server import main

    parser = argparse.ArgumentParser()
    main.add_arguments(parser)
    for name in KV_DTYPES:
        dtype = parser.parse_args(["--kv-dtype", name]).kv_dtype
        assert fp8.TORCH_DTYPES[KVDtype(dtype)].itemsize == KVDtype(dtype).bytes_per_element
