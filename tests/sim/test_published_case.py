"""Case format v2 (arms, a closed loop, published values per arm, effects) and its one door, `parse_case`."""

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench.cli.main import main
from kvbench.sim.kv_offload import Connector, Medium
from kvbench.sim.published import (
    WHOLE,
    CaseError,
    case_config,
    compare_arm,
    effect_rows,
    measured,
    parse_case,
)

SHIPPED = Path(__file__).resolve().parents[2] / "results" / "sim" / "published" / "llm-d-precise-prefix.yaml"

V2 = """
name: tiny-v2
hardware: {profile: cpu, devices_per_replica: 1, replicas: 2}
model: tiny-random
engine: {name: vllm, block_size: 4, gpu_memory_utilization: 0.5, max_num_seqs: 8, max_num_batched_tokens: 64,
         kv_dtype: bf16}
workload: {generator: shared_prefix, num_groups: 2, num_prompts_per_group: 3, system_prompt_len: 32,
           question_len: 4, output_len: 3}
load: {closed_loop: {concurrency: 3, num_requests: 6}}
arms:
  baseline: {router: precise-prefix}
  offload:
    router: {name: precise-prefix, weights: {queue: 2, kv_utilization: 2, gpu_prefix: 1, cpu_prefix: 1}}
    engine: {kv_offload: {medium: cpu, connector: vllm-native, bytes_per_replica: 1.0e+6}}
published:
  baseline: {total_tok_s: 1000.0, ttft_mean_s: 1.0}
  offload: {total_tok_s: 1100.0, ttft_mean_s: 0.9}
effects:
  - {arm: offload, over: baseline, metric: total_tok_s}
"""


def write(tmp_path, text: str, name: str = "case.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_shipped_version_1_case_loads_unchanged():
    case = parse_case(SHIPPED)
    doc = yaml.safe_load(SHIPPED.read_text())
    assert case.arm_names == tuple(doc["routers"]) == ("round-robin", "precise-prefix")
    assert [a.router.name for a in case.arms] == list(doc["routers"]) and all(
        a.router.weights is None for a in case.arms
    )
    for arm, metrics in doc["published"].items():
        assert {m: list(v) for m, v in case.published[arm].stages.items()} == metrics
    assert {a: dict(p.whole) for a, p in case.published.items()} == doc["whole_ladder"]
    assert case.plan.total_requests == 17084 - 0 and case.closed_loop is None and case.max_concurrency == 1600
    assert case.engine.block_size == 64 and case.arms[0].kv_offload is None


def test_the_issues_spelling_loads_into_arms_a_closed_loop_and_an_effect(tmp_path):
    case = parse_case(write(tmp_path, V2))
    assert case.plan is None and (case.closed_loop.concurrency, case.closed_loop.num_requests) == (3, 6)
    offload = case.arm("offload")
    assert offload.kv_offload.medium == Medium.CPU and offload.kv_offload.connector == Connector.VLLM_NATIVE
    assert offload.engine.block_size == 4  # the case's engine, with the arm's replacements
    assert offload.router.weights == {"queue": 2, "kv_utilization": 2, "gpu_prefix": 1, "cpu_prefix": 1}
    assert case.published["offload"].whole == {"total_tok_s": 1100.0, "ttft_mean_s": 0.9}
    # The CPU-prefix scorer's index defaults to the arm's CPU tier in blocks: 1e6 bytes / (bytes per token x 4).
    config = case_config(case, "offload")
    assert config.preset.scorers.cpu_lru_blocks == config.tier_pages(1.0e6) and config.preset.scorers.gpu_prefix == 1
    assert config.kv_offload is offload.kv_offload
    assert case_config(case, "baseline").preset.scorers.gpu_prefix == 3  # no weights: the guide's 3 / 2 / 2


def test_a_prefix_affinity_arm_carries_its_filters_parameters_into_the_router(tmp_path):
    text = V2.replace(
        "{router: precise-prefix}", "{router: {name: prefix-affinity, affinity_threshold: 0.5, peak_prefill_tok_s: 9}}"
    )
    case = parse_case(write(tmp_path, text))
    preset = case_config(case, "baseline").preset
    assert preset.route == "prefix-affinity"
    assert (preset.affinity.threshold, preset.affinity.peak_prefill_tok_s) == (0.5, 9.0)
    assert preset.affinity.max_ttft_penalty_s == 5.0  # the plugin's default where the case gives none
    assert case_config(case, "offload").preset.affinity.threshold == 0.8


def test_validate_published_writes_the_issues_comparison_json(tmp_path):
    path = write(tmp_path, V2)
    out = tmp_path / "out"
    assert main(["validate-published", str(path), "--out", str(out)]) == 0
    doc = json.loads((out / "comparison.json").read_text())
    case = parse_case(path)
    runs = {arm: compare_arm(case, arm) for arm in case.arm_names}
    for arm, run in runs.items():
        assert len(run.result.records) == 6  # the closed loop's requests, all measured
        simulated = measured(run.result.records)
        for metric in ("total_tok_s", "ttft_mean_s"):
            cell = doc["arms"][arm][metric]
            assert cell["simulated"] == pytest.approx(simulated[metric])
            assert cell["ratio"] == pytest.approx(simulated[metric] / cell["published"])
    (effect,) = doc["effects"]
    assert (effect["arm"], effect["over"], effect["metric"]) == ("offload", "baseline", "total_tok_s")
    assert effect["published_change"] == pytest.approx(0.1)
    sim = doc["arms"]["offload"]["total_tok_s"]["simulated"] / doc["arms"]["baseline"]["total_tok_s"]["simulated"]
    assert effect["simulated_change"] == pytest.approx(sim - 1)
    assert doc["stages"] == {}  # a closed loop has no stages


def test_an_effect_needs_both_arms_to_publish_its_metric(tmp_path):
    with pytest.raises(CaseError, match=r"effects\[0\].*'offload' publishes no 'e2e_mean_s' whole-run"):
        parse_case(write(tmp_path, V2.replace("metric: total_tok_s}", "metric: e2e_mean_s}")))


def test_an_effect_row_compares_the_simulated_change_with_the_published_one(tmp_path):
    from kvbench.sim.published import Row

    case = parse_case(write(tmp_path, V2))
    rows = [Row("baseline", WHOLE, "total_tok_s", 1000.0, 500.0), Row("offload", WHOLE, "total_tok_s", 1100.0, 525.0)]
    (effect,) = effect_rows(case, rows)
    assert effect.published_change == pytest.approx(0.10) and effect.simulated_change == pytest.approx(0.05)
    assert effect.same_direction and effect.size_ratio == pytest.approx(0.5)


@pytest.mark.parametrize(
    "edit, field",
    [
        (("  baseline: {total_tok_s: 1000.0, ttft_mean_s: 1.0}", '  baseline: "x"'), "published.baseline"),
        (("block_size: 4,", "block_size: 0,"), "engine.block_size"),
        (("block_size: 4,", "block_size: four,"), "engine.block_size"),
        (("bytes_per_replica: 1.0e+6", "bytes_per_replica: -1"), "arms.offload.engine.kv_offload.bytes_per_replica"),
        (("concurrency: 3,", "concurrency: [3],"), "load.closed_loop.concurrency"),
        (("gpu_prefix: 1,", "gpu_prefix: lots,"), "arms.offload.router.weights.gpu_prefix"),
        (("{router: precise-prefix}", "{router: {name: round-robin, weights: {queue: 1}}}"), "arms.baseline.router"),
        (("replicas: 2}", "replicas: 2.5}"), "hardware.replicas"),
        (
            ("{router: precise-prefix}", "{router: {name: precise-prefix, peak_prefill_tok_s: 9}}"),
            "arms.baseline.router",
        ),
        (
            ("{router: precise-prefix}", "{router: {name: prefix-affinity, affinity_threshold: 2}}"),
            "affinity_threshold",
        ),
        (("load: {closed_loop", 'stages: {ladder: "1:1"}\nload: {closed_loop'), "give one load"),
        (("total_tok_s: 1100.0,", "total_tok_s: [1, 2],"), "closed loop has no stages"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_field(tmp_path, capsys, edit, field):
    path = write(tmp_path, V2.replace(*edit))
    assert V2.replace(*edit) != V2
    with pytest.raises(CaseError, match=field.replace("[", r"\[").replace(".", r"\.")):
        parse_case(path)
    assert main(["validate-published", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err


# Any YAML value in any field: read, or refused with a CaseError (never another exception).
yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6,
)


def field_paths(doc, prefix=()):
    """Every path into `doc` (mapping keys and list positions), parents before children."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield prefix + (key,)
        yield from field_paths(value, prefix + (key,))


BASE = yaml.safe_load(V2)
PATHS = list(field_paths(BASE))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), value=yaml_values)
def test_any_value_in_any_field_is_read_or_refused_in_one_line(tmp_path, path, value):
    doc = json.loads(json.dumps(BASE))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    target = tmp_path / "prop.yaml"
    target.write_text(yaml.safe_dump(doc))
    try:
        case = parse_case(target)
    except CaseError as error:
        assert "\n" not in str(error) and str(error)
        return
    for arm in case.arm_names:  # what was read builds a fleet, or says in one line why it cannot
        try:
            case_config(case, arm)
        except CaseError as error:
            assert "\n" not in str(error)


def test_a_stage_effect_reads_that_stages_values_and_gap_s_spaces_the_stages(tmp_path):
    from kvbench.sim.published import Row

    text = (
        V2.replace("load: {closed_loop: {concurrency: 3, num_requests: 6}}", 'stages: {ladder: "2:1,4:1", gap_s: 30}')
        .replace(
            "  offload: {total_tok_s: 1100.0, ttft_mean_s: 0.9}",
            "  offload: {total_tok_s: 1100.0, ttft_mean_s: 0.9, request_s: [2.0, 3.0]}\n  baseline_stages: {}",
        )
        .replace(
            "  baseline: {total_tok_s: 1000.0, ttft_mean_s: 1.0}",
            "  baseline: {total_tok_s: 1000.0, ttft_mean_s: 1.0, request_s: [2.0, 4.0]}",
        )
    )
    text = (
        text.replace("  baseline_stages: {}\n", "")
        + "  - {arm: offload, over: baseline, metric: request_s, stage: 4}\n"
    )
    case = parse_case(write(tmp_path, text))
    assert case.plan.gap_s == 30.0 and case.effects[1].stage == "4"
    rows = [Row("baseline", "4", "request_s", 4.0, 3.0), Row("offload", "4", "request_s", 3.0, 3.3)]
    effect = effect_rows(case, rows)[1]
    assert effect.published_change == pytest.approx(-0.25) and effect.simulated_change == pytest.approx(0.1)
    assert effect.same_direction is False
    with pytest.raises(CaseError, match=r"effects\[1\]\.stage is '5'"):
        parse_case(write(tmp_path, text.replace("stage: 4}", "stage: 5}"), "bad.yaml"))
