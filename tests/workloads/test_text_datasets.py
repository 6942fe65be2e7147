"""Real and vLLM-style datasets through Hugging Face `datasets`, on the small fixtures in tests/data/datasets
(ShareGPT JSON/JSONL, a parquet file, a word-level tokenizer trained on their text)."""

from __future__ import annotations

import asyncio

import datasets
import numpy as np
import pandas as pd
import pytest
from transformers import AutoTokenizer

from kvbench.harness.client import EndpointConfig
from kvbench.harness.instrument import InstrumentBehaviour
from kvbench.harness.loadgen import LoadGenerator
from kvbench.measure.schedule import LoadSpec
from kvbench.workloads.profiles import load_workload
from kvbench.workloads.spec import WorkloadError
from kvbench.workloads.tokens import safe_token_range

from ..harness.instrument_fixture import serving
from ..paths import REPO

DATA = REPO / "tests" / "data" / "datasets"
TOKENIZER = str(DATA / "tokenizer")
encode = AutoTokenizer.from_pretrained(TOKENIZER).encode


def _tokens(text):
    return encode(text, add_special_tokens=False)


@pytest.mark.parametrize("suffix", ["json", "jsonl"])
def test_sharegpt_conversations_become_sessions_of_answered_human_turns(suffix):
    workload = load_workload(f"sharegpt:{DATA}/sharegpt.{suffix}", overrides={"tokenizer": TOKENIZER})
    assert [(s.session_id, len(s.turns)) for s in workload.sessions] == [("c0", 2), ("c1", 1), ("c2", 1)]
    first = workload.sessions[0].turns
    assert first[0].user_tokens.tolist() == _tokens("What does a KV cache store during decoding?")
    assert first[0].max_tokens == len(
        _tokens(
            "It stores the keys and values of every earlier token, so each new "
            "token attends to them without recomputing the whole prompt."
        )
    )
    # c1 opens with an answer and ends with a question: neither is a request
    assert workload.sessions[1].turns[0].user_tokens.tolist() == _tokens("Name one reason to quantize the KV cache.")
    assert (
        load_workload(
            f"sharegpt:{DATA}/sharegpt.{suffix}", num_sessions=2, overrides={"tokenizer": TOKENIZER, "output_len": 7}
        )
        .sessions[1]
        .turns[0]
        .max_tokens
        == 7
    )


def test_a_sharegpt_sessions_next_turn_carries_the_real_answer():
    workload = load_workload(f"sharegpt:{DATA}/sharegpt.json", num_sessions=1, overrides={"tokenizer": TOKENIZER})

    async def go():
        async with serving(InstrumentBehaviour(first_token_ms=2, chunk_interval_ms=1)) as (url, log):
            result = await LoadGenerator(EndpointConfig(url, "m"), LoadSpec(concurrency=1), run_id="t").run(workload)
            return result, log

    result, log = asyncio.run(go())
    assert [record.ok for record in result.records] == [True, True]
    asks = [s.user_tokens.tolist() for s in workload.sessions[0].turns]
    answer = list(range(1000, 1000 + workload.sessions[0].turns[0].max_tokens))  # the instrument's ids
    assert log.bodies[0]["prompt"] == asks[0]
    assert log.bodies[1]["prompt"] == asks[0] + answer + asks[1]
    assert log.bodies[1]["max_tokens"] == workload.sessions[0].turns[1].max_tokens


def test_a_parquet_file_and_a_saved_dataset_map_their_columns(tmp_path):
    options = {"tokenizer": TOKENIZER, "prompt_column": "question", "output_column": "reference"}
    parquet = load_workload(f"dataset:{DATA}/qa.parquet", overrides=options)
    frame = pd.read_parquet(DATA / "qa.parquet")
    assert [s.turns[0].user_tokens.tolist() for s in parquet.sessions] == [_tokens(q) for q in frame.question]
    assert [s.turns[0].max_tokens for s in parquet.sessions] == [len(_tokens(a)) for a in frame.reference]
    datasets.Dataset.from_pandas(frame).save_to_disk(str(tmp_path / "saved"))
    saved = load_workload(f"dataset:{tmp_path / 'saved'}", overrides=options)
    assert [s.turns[0].user_tokens.tolist() for s in saved.sessions] == [
        s.turns[0].user_tokens.tolist() for s in parquet.sessions
    ]
    fixed = load_workload(f"dataset:{DATA}/qa.parquet", overrides={"tokenizer": TOKENIZER, "prompt_column": "question"})
    assert {s.turns[0].max_tokens for s in fixed.sessions} == {128}  # vLLM's default output length
    with pytest.raises(WorkloadError, match="no column 'prompt'; columns: question, reference"):
        load_workload(f"dataset:{DATA}/qa.parquet", overrides={"tokenizer": TOKENIZER})


def test_text_needs_a_tokenizer_and_options_are_checked_by_name():
    with pytest.raises(WorkloadError, match="give a local tokenizer folder"):
        load_workload(f"sharegpt:{DATA}/sharegpt.json")
    with pytest.raises(WorkloadError, match="unknown option.*prompt_len; valid: input_len"):
        load_workload("random", overrides={"prompt_len": 5})
    with pytest.raises(WorkloadError, match="does not exist"):
        load_workload(f"sharegpt:{DATA}/missing.json", overrides={"tokenizer": TOKENIZER})


def test_random_is_vllms_lengths_around_the_target_after_a_shared_prefix():
    options = {"input_len": 100, "output_len": 20, "range_ratio": 0.5, "prefix_len": 16}
    workload = load_workload("random", num_sessions=200, overrides=options, vocab_size=5000, seed=3)
    inputs = np.array([len(s.turns[0].user_tokens) for s in workload.sessions])
    outputs = np.array([s.turns[0].max_tokens for s in workload.sessions])
    assert 50 <= inputs.min() and inputs.max() <= 150 and inputs.std() > 10
    assert 10 <= outputs.min() and outputs.max() <= 30
    prefixes = {s.context.tobytes() for s in workload.sessions}
    assert len(prefixes) == 1 and len(workload.sessions[0].context) == 16
    ids = safe_token_range(5000)
    assert all(
        ids.low <= s.turns[0].user_tokens.min() and s.turns[0].user_tokens.max() < ids.high for s in workload.sessions
    )
    again = load_workload("random", num_sessions=200, overrides=options, vocab_size=5000, seed=3)
    assert all(
        np.array_equal(a.turns[0].user_tokens, b.turns[0].user_tokens)
        for a, b in zip(workload.sessions, again.sessions)
    )


def test_prefix_repetition_shares_each_prefix_among_its_prompts():
    options = {"prefix_len": 32, "suffix_len": 8, "num_prefixes": 4, "output_len": 5}
    workload = load_workload("prefix_repetition", num_sessions=20, overrides=options)
    by_prefix = pd.Series([s.context.tobytes() for s in workload.sessions]).value_counts()
    assert sorted(by_prefix) == [5, 5, 5, 5]
    assert {len(s.turns[0].user_tokens) for s in workload.sessions} == {8}
    assert {s.turns[0].max_tokens for s in workload.sessions} == {5}
    assert [s.session_id for s in workload.sessions] != sorted(s.session_id for s in workload.sessions)  # shuffled


def test_run_passes_its_tokenizer_to_a_text_dataset():
    from ..cli.test_cli_run import _run_config

    config = _run_config("--workload", f"sharegpt:{DATA}/sharegpt.json", "--tokenizer", TOKENIZER)
    assert config.workloads[0].overrides == {"tokenizer": TOKENIZER}
    assert len(config.workloads[0].load(0).sessions) == 3
