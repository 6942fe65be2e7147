"""Trace readers against the facts in the public traces' README (tests/data/shared/traces/README.md), and
their errors on malformed rows."""

import json

import numpy as np
import pytest

from kvbench.workloads.kvbench_jsonl import read_kvbench_jsonl, write_kvbench_jsonl
from kvbench.workloads.spec import Session, TenantSpec, Turn, Workload, token_array
from kvbench.workloads.stats import workload_stats
from kvbench.workloads.trace_fields import TraceFormatError
from kvbench.workloads.traces import read_azure, read_mooncake, sniff_trace_format


def input_lengths(workload):
    return np.array([len(s.context) + len(s.turns[0].user_tokens) for s in workload.sessions])


def test_mooncake_matches_the_readme(mooncake_workload):
    workload = mooncake_workload
    lengths = input_lengths(workload)
    outputs = np.array([s.turns[0].max_tokens for s in workload.sessions])
    duration = workload.sessions[-1].arrival_s - workload.sessions[0].arrival_s
    assert len(workload.sessions) == 3993
    assert lengths.mean() == pytest.approx(15325, abs=1)
    assert np.median(lengths) == 11587
    assert outputs.mean() == pytest.approx(149, abs=1)
    assert duration == pytest.approx(1022, abs=1)
    assert len(workload.sessions) / duration == pytest.approx(3.91, abs=0.01)


def test_mooncake_prefix_hit_rate_is_the_readme_figure(mooncake_workload):
    # The README's 65.1% counts leading 512-token blocks seen earlier (the last, partial block by its real
    # length). The oracle is token-exact; on this trace the two agree to 0.001 pt, because random 512-token
    # blocks almost never share tokens by chance past a differing hash.
    stats = workload_stats(mooncake_workload)
    assert stats.oracle_hit_rate == pytest.approx(0.651, abs=0.001)


def test_mooncake_equal_hashes_give_equal_tokens_and_the_last_block_is_a_prefix(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [7, 8, 9]},
        {"timestamp": 500, "input_length": 600, "output_length": 5, "hash_ids": [7, 3]},
        {"timestamp": 900, "input_length": 1536, "output_length": 5, "hash_ids": [7, 8, 9]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, b, c = (s.context for s in read_mooncake(path).sessions)
    assert (len(a), len(b), len(c)) == (1100, 600, 1536)
    assert np.array_equal(a[:512], b[:512])
    assert not np.array_equal(a[512:600], b[512:600])
    assert np.array_equal(a, c[:1100])  # block 9 cut to 76 tokens is a prefix of the full block 9
    other_seed = read_mooncake(path, seed=1).sessions[0].context
    assert not np.array_equal(a, other_seed)


def test_azure_conv_matches_the_readme(azure_conv_workload):
    workload = azure_conv_workload
    lengths = input_lengths(workload)
    outputs = np.array([s.turns[0].max_tokens for s in workload.sessions])
    duration = workload.sessions[-1].arrival_s
    assert len(workload.sessions) == 19366
    assert lengths.mean() == pytest.approx(1155, abs=1)
    assert np.median(lengths) == 1020
    assert outputs.mean() == pytest.approx(211, abs=1)
    assert duration / 60 == pytest.approx(58.4, abs=0.05)
    assert len(workload.sessions) / duration == pytest.approx(5.53, abs=0.01)


def test_azure_code_matches_the_readme(azure_code_path):
    workload = read_azure(azure_code_path)
    assert len(workload.sessions) == 8819
    assert input_lengths(workload).mean() == pytest.approx(2048, abs=1)
    assert workload.sessions[-1].arrival_s / 60 == pytest.approx(57.3, abs=0.05)


def test_azure_prompts_are_unique_and_time_keeps_sub_microsecond_digits(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,300,4\n"
        "2023-11-16 18:15:46.6805901,300,4\n2023-11-16 18:15:48.0000000,10,4\n"
    )
    workload = read_azure(path, time_scale=2.0)
    first, second, third = workload.sessions
    assert second.arrival_s == pytest.approx(2e-7, abs=1e-9)
    assert third.arrival_s == pytest.approx(2 * 1.31941, abs=1e-6)
    assert not np.array_equal(first.context, second.context)
    assert workload_stats(workload).reusable_tokens_total < 3  # only chance matches of random ids


def test_limit_keeps_the_first_rows_and_time_scale_multiplies_gaps(mooncake_workload, mooncake_path):
    few = read_mooncake(mooncake_path, limit=10, time_scale=0.5)
    assert len(few.sessions) == 10
    for fast, full in zip(few.sessions, mooncake_workload.sessions):
        assert fast.arrival_s == pytest.approx(full.arrival_s * 0.5)
        assert np.array_equal(fast.context, full.context)


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"timestamp": 0, "output_length": 5, "hash_ids": [1]}', "field 'input_length' is missing"),
        ('{"timestamp": -1, "input_length": 5, "output_length": 5, "hash_ids": [1]}', "field 'timestamp'"),
        ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1]}', "field 'hash_ids' has 1 ids"),
        ('{"timestamp": 0, "input_length": "5", "output_length": 5, "hash_ids": [1]}', "field 'input_length'"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": "1"}', "field 'hash_ids'"),
        ('{"timestamp": 0, "input_length": 5,', "not a JSON object"),
    ],
)
def test_malformed_mooncake_row_reports_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    good = '{"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [1]}'
    path.write_text(f"{good}\n\n{line}\n")
    with pytest.raises(TraceFormatError, match=f"^{path}:3: {message}"):
        read_mooncake(path)


@pytest.mark.parametrize(
    "row, message",
    [
        ("2023-11-16 18:15:46.1,abc,3", "field 'ContextTokens' must be an integer"),
        ("yesterday,10,3", "field 'TIMESTAMP'"),
        ("2023-11-16 18:15:46.1,10", "expected 3 fields"),
        ("2023-11-16 18:15:46.1,10,0", "field 'GeneratedTokens'"),
    ],
)
def test_malformed_azure_row_reports_file_and_line(tmp_path, row, message):
    path = tmp_path / "bad.csv"
    path.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,10,3\n{row}\n")
    with pytest.raises(TraceFormatError, match=f"^{path}:3: {message}"):
        read_azure(path)


def test_azure_rejects_a_wrong_header(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("time,input,output\n")
    with pytest.raises(TraceFormatError, match=f"^{path}:1: header"):
        read_azure(path)


def kvbench_lines(*rows):
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_kvbench_jsonl_lengths_ids_tenants_and_turn_order(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text(
        kvbench_lines(
            {"session_id": "b", "turn": 1, "user_tokens": [5, 6], "max_tokens": 3, "think_time_s": 2.5},
            {
                "session_id": "b",
                "turn": 0,
                "arrival_s": 4.0,
                "tenant": "acme",
                "tier": "premium",
                "context_length": 50,
                "user_tokens": [1, 2, 3],
                "max_tokens": 8,
            },
            {"session_id": "a", "turn": 0, "arrival_s": 1.0, "user_length": 20, "max_tokens": 4},
        )
    )
    workload = read_kvbench_jsonl(path, time_scale=2.0)
    a, b = workload.sessions
    assert (a.session_id, a.tenant, a.arrival_s) == ("a", "default", 0.0)
    assert (len(a.context), len(a.turns[0].user_tokens)) == (0, 20)
    assert (b.tenant, b.arrival_s, len(b.context)) == ("acme", 6.0, 50)
    assert [t.user_tokens.tolist() for t in b.turns] == [[1, 2, 3], [5, 6]]
    assert [(t.max_tokens, t.think_time_s) for t in b.turns] == [(8, 0.0), (3, 5.0)]
    tenants = {t.name: (t.share, t.tier) for t in workload.tenants}
    assert tenants == {"default": (0.5, "basic"), "acme": (0.5, "premium")}
    assert np.array_equal(read_kvbench_jsonl(path).sessions[1].context, b.context)  # seeded lengths


@pytest.mark.parametrize(
    "rows, line, message",
    [
        ([{"turn": 0, "arrival_s": 0, "user_length": 3, "max_tokens": 1}], 1, "field 'session_id'"),
        ([{"session_id": "a", "turn": 0, "user_length": 3, "max_tokens": 1}], 1, "field 'arrival_s' is missing"),
        ([{"session_id": "a", "turn": 0, "arrival_s": 0, "user_length": 3}], 1, "field 'max_tokens' is missing"),
        ([{"session_id": "a", "turn": 0, "arrival_s": 0, "max_tokens": 1}], 1, "field 'user_tokens' or"),
        (
            [{"session_id": "a", "turn": 0, "arrival_s": 0, "user_tokens": [1, -2], "max_tokens": 1}],
            1,
            "field 'user_tokens' must be a list",
        ),
        (
            [
                {"session_id": "a", "turn": 0, "arrival_s": 0, "user_length": 3, "max_tokens": 1},
                {"session_id": "a", "turn": 2, "user_length": 3, "max_tokens": 1},
            ],
            1,
            "field 'turn'.*without gaps",
        ),
        (
            [
                {"session_id": "a", "turn": 0, "arrival_s": 0, "user_length": 3, "max_tokens": 1},
                {"session_id": "a", "turn": 1, "arrival_s": 3, "user_length": 3, "max_tokens": 1},
            ],
            2,
            "field 'arrival_s' is only allowed on turn 0",
        ),
        (
            [
                {"session_id": "a", "turn": 0, "arrival_s": 0, "user_length": 3, "max_tokens": 1},
                {"session_id": "a", "turn": 0, "arrival_s": 0, "user_length": 3, "max_tokens": 1},
            ],
            2,
            "field 'turn' 0 repeats",
        ),
    ],
)
def test_malformed_kvbench_row_reports_file_and_line(tmp_path, rows, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(kvbench_lines(*rows))
    with pytest.raises(TraceFormatError, match=f"^{path}:{line}: {message}"):
        read_kvbench_jsonl(path)


def test_write_then_read_kvbench_jsonl_gives_the_same_workload(tmp_path):
    sessions = (
        Session("x", "t1", 0.0, token_array([9, 8, 7]), (Turn(token_array([1]), 4), Turn(token_array([2, 3]), 5, 1.5))),
        Session("y", "t2", 2.0, token_array([]), (Turn(token_array([4, 4]), 6),)),
    )
    workload = Workload("w", sessions, 32000, (TenantSpec("t1", 0.5, "premium"), TenantSpec("t2", 0.5)))
    path = tmp_path / "w.jsonl"
    write_kvbench_jsonl(workload, path)
    back = read_kvbench_jsonl(path)
    assert [(s.session_id, s.tenant, s.arrival_s, s.context.tolist()) for s in back.sessions] == [
        (s.session_id, s.tenant, s.arrival_s, s.context.tolist()) for s in sessions
    ]
    assert [[(t.user_tokens.tolist(), t.max_tokens, t.think_time_s) for t in s.turns] for s in back.sessions] == [
        [(t.user_tokens.tolist(), t.max_tokens, t.think_time_s) for t in s.turns] for s in sessions
    ]
    assert [t.tier for t in back.tenants] == ["premium", "basic"]


def test_sniffing_tells_the_formats_apart(tmp_path):
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text('{"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [1]}\n')
    kvbench = tmp_path / "k.jsonl"
    kvbench.write_text('{"session_id": "a", "turn": 0}\n')
    other = tmp_path / "o.jsonl"
    other.write_text('{"prompt": "hi"}\n')
    assert sniff_trace_format(mooncake) == "mooncake"
    assert sniff_trace_format(kvbench) == "kvbench"
    assert sniff_trace_format(tmp_path / "x.csv") == "azure"
    with pytest.raises(TraceFormatError, match="hash_ids.*session_id"):
        sniff_trace_format(other)
