"""The `shared_prefix` generator: inference-perf's synthetic prefix-caching workload, as token ids.

inference-perf (`inference_perf/datagen/shared_prefix_datagen.py`) builds `num_groups` system prompts of
`system_prompt_len` random tokens and, per group, `num_prompts_per_group` questions of `question_len` random
tokens; a prompt is its group's system prompt followed by one question, and asks for `output_len` tokens
(the benchmark sends ignore_eos). The `num_groups * num_prompts_per_group` prompts are shuffled once, and
request i sends prompt `i mod (groups * prompts)`: a run longer than one pass sends the same prompts again.

    request i:  [ system prompt of group g (shared by the group's prompts) | question (g, p) ]  -> output_len

Here each request is a one-turn session whose context is the system prompt and whose user tokens are the
question, so the load generator and the simulator send exactly these ids (`kvbench run` against a real server
too). inference-perf sends text (decoded random ids, re-tokenized by the server: its reports show ~5% more
prompt tokens than the parameters); kvbench sends the ids, so prompt lengths are exactly the parameters.
Arrival times come from the load (`--rate`, `--stages`), not the workload: every session's own arrival is 0.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kvbench.workloads.spec import Session, Turn, Workload, WorkloadError, token_array
from kvbench.workloads.tokens import (
    DEFAULT_VOCAB_SIZE,
    MAX_TOKENS_PER_FIELD,
    keyed_tokens,
    safe_token_range,
    stable_key,
)

MAX_REQUESTS = 1_000_000


@dataclass(frozen=True)
class SharedPrefixParams:
    """inference-perf's five `shared_prefix` parameters (its names), plus how many requests to send and the
    vocabulary. `num_requests` None: one pass over the prompts (groups x prompts per group)."""

    num_groups: int = 150
    num_prompts_per_group: int = 5
    system_prompt_len: int = 6000
    question_len: int = 1200
    output_len: int = 1000
    num_requests: int | None = None
    vocab_size: int = DEFAULT_VOCAB_SIZE

    def __post_init__(self) -> None:
        for name in ("num_groups", "num_prompts_per_group", "output_len"):
            _check(getattr(self, name), name, 1, MAX_TOKENS_PER_FIELD)
        for name in ("system_prompt_len", "question_len"):
            _check(getattr(self, name), name, 0, MAX_TOKENS_PER_FIELD)
        if self.system_prompt_len + self.question_len < 1:
            raise WorkloadError("shared_prefix: system_prompt_len + question_len must be >= 1 (an empty prompt)")
        if self.num_requests is not None:
            _check(self.num_requests, "num_requests", 1, MAX_REQUESTS)

    @property
    def num_prompts(self) -> int:
        return self.num_groups * self.num_prompts_per_group

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def replace(self, overrides: Mapping[str, object]) -> SharedPrefixParams:
        """A copy with `overrides`; an unknown key raises WorkloadError naming the valid keys."""
        unknown = sorted(set(overrides) - set(self.field_names()))
        if unknown:
            raise WorkloadError(f"unknown shared_prefix parameter(s) {unknown}; valid keys: {list(self.field_names())}")
        return dataclasses.replace(self, **overrides)


def _check(value: object, name: str, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise WorkloadError(f"shared_prefix.{name} is {value!r}; use an int in [{low}, {high:,}]")


def generate_shared_prefix(params: SharedPrefixParams, *, seed: int = 0, name: str = "shared-prefix") -> Workload:
    """The requests of a shared_prefix workload; the same params and seed give the same ids and order.

    Session `sp-{i}` is request i; its prompt is prompt `order[i mod num_prompts]` of the shuffled prompts,
    and every session of one group holds the same system prompt array (one copy in memory)."""
    token_range = safe_token_range(params.vocab_size)
    systems = [
        token_array(keyed_tokens(stable_key(seed, "shared-prefix-system", g), params.system_prompt_len, token_range))
        for g in range(params.num_groups)
    ]
    questions = [
        token_array(keyed_tokens(stable_key(seed, "shared-prefix-question", k), params.question_len, token_range))
        for k in range(params.num_prompts)
    ]
    order = np.random.default_rng([seed, 7]).permutation(params.num_prompts)  # inference-perf shuffles once
    count = params.num_requests if params.num_requests is not None else params.num_prompts
    sessions = []
    for i in range(count):
        k = int(order[i % params.num_prompts])
        group = k // params.num_prompts_per_group
        sessions.append(Session(f"sp-{i}", "default", 0.0, systems[group], (Turn(questions[k], params.output_len),)))
    return Workload(
        name,
        tuple(sessions),
        params.vocab_size,
        params={"generator": "shared_prefix", **dataclasses.asdict(params), "seed": seed},
    )
