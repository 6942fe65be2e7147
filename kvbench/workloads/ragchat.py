"""The `rag-chat` generator: multi-turn RAG conversations whose system prompts and documents recur.

Each session of tenant T:

    context  = system_prompt(T) + doc(T, d1) + ... + doc(T, dk)     documents drawn from T's corpus by Zipf
    turn 0   = user tokens (~user_tokens_mean), max_tokens            sent at the session's arrival
    turn i   = think time (lognormal, long tail), user tokens, max_tokens

Randomness is split into independent streams (see `tokens.py`): content streams keyed by
(seed, kind, tenant name, index) and one stream per session index, so a session, a document or a system prompt
is the same whatever the session count or the other tenants are.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kvbench.workloads.spec import TOKEN_DTYPE, Session, TenantSpec, Turn, Workload, WorkloadError, token_array
from kvbench.workloads.tokens import DEFAULT_VOCAB_SIZE, MAX_TOKENS_PER_FIELD, TokenRange, safe_token_range, stable_key

# Stream tags: the first words of every SeedSequence, so that streams of different kinds never coincide.
_SYSTEM_STREAM = 1
_DOCUMENT_STREAM = 2
_SESSION_STREAM = 3

ARRIVAL_PROCESSES = ("poisson", "gamma")
TIERS = ("premium", "basic")


# Sizes past which a generated workload would not fit this machine's memory or finish generating in minutes.
MAX_SESSIONS = 1_000_000
MAX_TURNS = 1024
MAX_CORPUS_TOKENS = 1 << 28


@dataclass(frozen=True)
class RagChatParams:
    """Every size of the `rag-chat` workload. Token lengths are in tokens, times in seconds.

    Lengths with a `_cv` are lognormal with that mean and coefficient of variation, clipped to [min, max];
    think times are lognormal with that median and log-space sigma, clipped to [min, max]; turns per session are
    1 + Poisson(turns_mean - 1), clipped to turns_max. Session inter-arrival gaps are exponential (`poisson`) or
    gamma with coefficient of variation `arrival_cv` (> 1 is burstier than Poisson).
    """

    num_sessions: int = 256
    session_rate: float = 1.0
    arrival_process: str = "poisson"
    arrival_cv: float = 1.0
    tenants: tuple[TenantSpec, ...] = (TenantSpec("default"),)
    system_tokens: int = 1536
    corpus_docs: int = 1000
    zipf_exponent: float = 1.0
    docs_per_session: int = 8
    doc_tokens: int = 1024
    # Retrieved documents ordered by popularity (the corpus rank), so that sessions drawing the same popular
    # documents share a prefix beyond the system prompt; False keeps the random draw order.
    sort_docs_by_popularity: bool = True
    turns_mean: float = 6.0
    turns_max: int = 16
    user_tokens_mean: float = 200.0
    user_tokens_cv: float = 0.5
    user_tokens_min: int = 8
    user_tokens_max: int = 1024
    output_tokens_mean: float = 256.0
    output_tokens_cv: float = 0.75
    output_tokens_min: int = 8
    output_tokens_max: int = 1024
    think_time_median_s: float = 30.0
    think_time_sigma: float = 1.5
    think_time_min_s: float = 1.0
    think_time_max_s: float = 1800.0
    vocab_size: int = DEFAULT_VOCAB_SIZE

    def __post_init__(self) -> None:
        # Values may come from YAML or a command line: check types first, so that a wrong type is named too.
        for spec_field in dataclasses.fields(self):
            if spec_field.name != "tenants":
                _check_type(self, spec_field)
        object.__setattr__(self, "tenants", tuple(_tenant(t) for t in self.tenants))
        _check(self.num_sessions >= 1, "num_sessions", self.num_sessions, "an int >= 1")
        _check(self.session_rate > 0, "session_rate", self.session_rate, "sessions per second > 0")
        _check(
            self.arrival_process in ARRIVAL_PROCESSES,
            "arrival_process",
            self.arrival_process,
            f"one of {ARRIVAL_PROCESSES}",
        )
        _check(self.arrival_cv > 0, "arrival_cv", self.arrival_cv, "> 0 (1 is Poisson-like, > 1 bursty)")
        _check(len(self.tenants) >= 1, "tenants", self.tenants, "at least one tenant")
        names = [t.name for t in self.tenants]
        _check(len(set(names)) == len(names), "tenants", names, "unique tenant names")
        for tenant in self.tenants:
            _check(tenant.share > 0, "tenants.share", tenant.share, f"> 0 (tenant {tenant.name})")
            _check(tenant.tier in TIERS, "tenants.tier", tenant.tier, f"one of {TIERS} (tenant {tenant.name})")
        for name in ("system_tokens", "corpus_docs", "doc_tokens", "turns_max", "user_tokens_min", "output_tokens_min"):
            _check(getattr(self, name) >= 1, name, getattr(self, name), "an int >= 1")
        _check(self.num_sessions <= MAX_SESSIONS, "num_sessions", self.num_sessions, f"at most {MAX_SESSIONS:,}")
        _check(self.turns_max <= MAX_TURNS, "turns_max", self.turns_max, f"at most {MAX_TURNS}")
        for name in ("system_tokens", "doc_tokens", "user_tokens_max", "output_tokens_max"):
            _check(
                getattr(self, name) <= MAX_TOKENS_PER_FIELD,
                name,
                getattr(self, name),
                f"at most {MAX_TOKENS_PER_FIELD:,} tokens (past any context window)",
            )
        _check(
            self.corpus_docs * self.doc_tokens <= MAX_CORPUS_TOKENS,
            "corpus_docs",
            self.corpus_docs,
            f"at most {MAX_CORPUS_TOKENS:,} corpus tokens in all (corpus_docs x doc_tokens)",
        )
        _check(self.docs_per_session >= 0, "docs_per_session", self.docs_per_session, "an int >= 0")
        _check(
            self.docs_per_session <= self.corpus_docs,
            "docs_per_session",
            self.docs_per_session,
            f"at most corpus_docs ({self.corpus_docs})",
        )
        _check(self.zipf_exponent >= 0, "zipf_exponent", self.zipf_exponent, ">= 0 (0 is uniform)")
        _check(
            1 <= self.turns_mean <= self.turns_max,
            "turns_mean",
            self.turns_mean,
            f"between 1 and turns_max ({self.turns_max})",
        )
        for prefix in ("user_tokens", "output_tokens"):
            low, high = getattr(self, f"{prefix}_min"), getattr(self, f"{prefix}_max")
            mean = getattr(self, f"{prefix}_mean")
            _check(low <= mean <= high, f"{prefix}_mean", mean, f"between {prefix}_min and {prefix}_max")
            _check(getattr(self, f"{prefix}_cv") >= 0, f"{prefix}_cv", getattr(self, f"{prefix}_cv"), ">= 0")
        _check(
            0 <= self.think_time_min_s <= self.think_time_median_s <= self.think_time_max_s,
            "think_time_median_s",
            self.think_time_median_s,
            "between think_time_min_s and think_time_max_s",
        )
        _check(self.think_time_sigma >= 0, "think_time_sigma", self.think_time_sigma, ">= 0")
        safe_token_range(self.vocab_size)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def replace(self, overrides: Mapping[str, object]) -> RagChatParams:
        """A copy with `overrides` applied; an unknown key raises WorkloadError naming the valid keys."""
        unknown = sorted(set(overrides) - set(self.field_names()))
        if unknown:
            raise WorkloadError(f"unknown rag-chat parameter(s) {unknown}; valid keys: {list(self.field_names())}")
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict[str, object]:
        """Plain types (tenants as mappings), as saved with run results and accepted back by `replace`."""
        return dataclasses.asdict(self) | {"tenants": [dataclasses.asdict(t) for t in self.tenants]}


def generate_rag_chat(params: RagChatParams, *, seed: int = 0, name: str = "rag-chat") -> Workload:
    """The sessions of a rag-chat workload; the same params and seed give identical token ids and times."""
    token_range = safe_token_range(params.vocab_size)
    shares = np.array([t.share for t in params.tenants], dtype=np.float64)
    shares /= shares.sum()
    contexts = _ContextBuilder(params, seed, token_range)
    sessions = []
    arrival_s = 0.0
    for index in range(params.num_sessions):
        rng = np.random.default_rng([seed, _SESSION_STREAM, index])
        # Draw order is fixed: gap, tenant, documents, turns; session 0 arrives at time 0.
        gap = _arrival_gap(rng, params)
        arrival_s += gap if index > 0 else 0.0
        tenant = params.tenants[int(rng.choice(len(params.tenants), p=shares))]
        context = contexts.context(tenant.name, rng)
        sessions.append(Session(f"s{index:06d}", tenant.name, arrival_s, context, _turns(rng, params, token_range)))
    return Workload(
        name,
        tuple(sessions),
        params.vocab_size,
        params.tenants,
        {"generator": "rag-chat", "seed": seed, **params.to_dict()},
    )


class _ContextBuilder:
    """System prompts and documents of each tenant, each drawn once per generation from its own stream."""

    def __init__(self, params: RagChatParams, seed: int, token_range: TokenRange) -> None:
        self._params = params
        self._seed = seed
        self._range = token_range
        ranks = np.arange(1, params.corpus_docs + 1, dtype=np.float64)
        popularity = ranks**-params.zipf_exponent
        self._popularity = popularity / popularity.sum()
        self._system: dict[str, np.ndarray] = {}
        self._documents: dict[tuple[str, int], np.ndarray] = {}

    def context(self, tenant: str, rng: np.random.Generator) -> np.ndarray:
        params = self._params
        doc_ids = rng.choice(params.corpus_docs, size=params.docs_per_session, replace=False, p=self._popularity)
        if params.sort_docs_by_popularity:
            doc_ids = np.sort(doc_ids)
        parts = [self._system_prompt(tenant)] + [self._document(tenant, int(d)) for d in doc_ids]
        return token_array(np.concatenate(parts))

    def _system_prompt(self, tenant: str) -> np.ndarray:
        if tenant not in self._system:
            rng = np.random.default_rng([self._seed, _SYSTEM_STREAM, stable_key(tenant)])
            self._system[tenant] = self._draw(rng, self._params.system_tokens)
        return self._system[tenant]

    def _document(self, tenant: str, doc_id: int) -> np.ndarray:
        key = (tenant, doc_id)
        if key not in self._documents:
            rng = np.random.default_rng([self._seed, _DOCUMENT_STREAM, stable_key(tenant), doc_id])
            self._documents[key] = self._draw(rng, self._params.doc_tokens)
        return self._documents[key]

    def _draw(self, rng: np.random.Generator, length: int) -> np.ndarray:
        return rng.integers(self._range.low, self._range.high, size=length, dtype=TOKEN_DTYPE)


def _arrival_gap(rng: np.random.Generator, params: RagChatParams) -> float:
    mean_gap = 1.0 / params.session_rate
    if params.arrival_process == "poisson":
        return float(rng.exponential(mean_gap))
    shape = 1.0 / params.arrival_cv**2
    return float(rng.gamma(shape, mean_gap / shape))


def _turns(rng: np.random.Generator, params: RagChatParams, token_range: TokenRange) -> tuple[Turn, ...]:
    count = min(1 + int(rng.poisson(params.turns_mean - 1)), params.turns_max)
    user_lengths = _lognormal_lengths(
        rng, count, params.user_tokens_mean, params.user_tokens_cv, params.user_tokens_min, params.user_tokens_max
    )
    output_lengths = _lognormal_lengths(
        rng,
        count,
        params.output_tokens_mean,
        params.output_tokens_cv,
        params.output_tokens_min,
        params.output_tokens_max,
    )
    think = rng.lognormal(math.log(params.think_time_median_s), params.think_time_sigma, size=count)
    think = np.clip(think, params.think_time_min_s, params.think_time_max_s)
    turns = []
    for i in range(count):
        user = rng.integers(token_range.low, token_range.high, size=int(user_lengths[i]), dtype=TOKEN_DTYPE)
        turns.append(Turn(token_array(user), int(output_lengths[i]), float(think[i]) if i > 0 else 0.0))
    return tuple(turns)


def _lognormal_lengths(rng: np.random.Generator, size: int, mean: float, cv: float, low: int, high: int):
    sigma2 = math.log1p(cv * cv)
    values = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), size=size)
    return np.clip(np.rint(values), low, high).astype(np.int64)


def _tenant(value: TenantSpec | Mapping[str, object]) -> TenantSpec:
    if isinstance(value, TenantSpec):
        return value
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"name", "share", "tier"})
        if unknown or "name" not in value:
            raise WorkloadError(f"tenant {dict(value)!r}: keys must be name (required), share, tier")
        return TenantSpec(str(value["name"]), float(value.get("share", 1.0)), str(value.get("tier", "basic")))
    raise WorkloadError(f"tenants: expected a mapping with name/share/tier, got {value!r}")


def _check_type(params: RagChatParams, spec_field: dataclasses.Field) -> None:
    value = getattr(params, spec_field.name)
    expected = type(spec_field.default)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        object.__setattr__(params, spec_field.name, float(value))
    elif type(value) is not expected:
        _check(False, spec_field.name, value, f"a value of type {expected.__name__}")


def _check(ok: bool, field: str, value: object, expected: str) -> None:
    if not ok:
        raise WorkloadError(f"rag-chat parameter {field}={value!r}: expected {expected}")
