"""A flag-built run sized to its workload (cli/run_sizing.py): the default budget is the workload's when smaller
(no warning for what nobody asked), --num-prompts beyond a generated workload grows its sessions, and a budget
with --num-sessions fixed, or within the workload, is left as asked."""

from __future__ import annotations

from kvbench.cli.commands.run_cmd import DEFAULT_NUM_REQUESTS, config_from_args
from kvbench.cli.main import build_parser
from kvbench.workloads.profiles import load_workload

URL = ["--url", "http://127.0.0.1:1"]


def _config(*flags):
    return config_from_args(build_parser().parse_args(["run", *URL, *flags]))


def test_the_default_budget_is_the_workloads_own_when_it_has_fewer():
    mini = load_workload("rag-chat-mini")
    assert mini.num_requests < DEFAULT_NUM_REQUESTS
    assert _config().stop.num_requests == mini.num_requests
    assert _config("--workload", "rag-chat").stop.num_requests == DEFAULT_NUM_REQUESTS  # it has more


def test_num_prompts_beyond_a_generated_workload_grows_its_sessions(capsys):
    config = _config("--num-prompts", "50")
    (spec,) = config.workloads
    grown = spec.load(config.seed)
    assert config.stop.num_requests == 50 and grown.num_requests >= 50
    assert len(grown.sessions) > len(load_workload("rag-chat-mini").sessions)
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("note: rag-chat-mini: 50 requests asked") and f"{spec.num_sessions} sessions" in line


def test_a_budget_within_the_workload_or_with_fixed_sessions_is_left_as_asked(capsys):
    assert _config("--num-requests", "10").stop.num_requests == 10
    fixed = _config("--num-prompts", "50", "--num-sessions", "5")
    assert fixed.stop.num_requests == 50 and fixed.workloads[0].num_sessions == 5  # the run caps it, warning
    assert capsys.readouterr().out == ""
