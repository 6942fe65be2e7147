"""The one conversation driver: how a run plays a workload's sessions, for the load generator and the simulator.

Both play the same conversations; only the clock (wall or virtual) and the transport (HTTP or simulated
nodes) differ. The driver owns what they share:

- turn order: a session's turns are asked one after another, turn k+1 only once turn k is answered;
- the prompt of turn k, carrying the engine's real answers as token ids:

      prompt(k) = context + user(0) + answer(0) + user(1) + answer(1) + ... + user(k)

- think times: turn k+1 is due `think_time_s` after turn k was answered (the transport adds it on its clock);
- the request budget and warmup: requests are counted as they are asked, the first `warmup_requests` are
  warmup, none is asked past `num_requests` or `duration_s`;
- the oracle: `reusable_tokens` of each prompt under the engine's isolation rule (`ReuseOracle`);
- what each request's record says of its asking (`Asked`); the transport's answer completes it (`record_builder`).

A transport asks (`Conversation.ask`), sends the prompt, and hands the answer back (`Conversation.answered`);
a failed turn ends its session (the next prompt would not be real). The driver knows no clock, no asyncio
and no HTTP.

Isolation. Which earlier prompts an engine may reuse for a tenant's prompt is the engine's rule, and the
oracle follows it (`Isolation`): STRICT (our engine's default) reuses only the same tenant's prompts;
SHARED_PREFIX (our engine's `--isolation shared-prefix`) also reuses, across tenants, the prefixes the
tenants file declares in `shared_prefixes` and nothing beyond them; SHARED_ALL (vLLM, SGLang, any endpoint
without tenants) reuses every prefix of every tenant.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvbench.measure.record_builder import Asked
from kvbench.measure.records import RequestRecord
from kvbench.measure.schedule import LoadSpec
from kvbench.workloads.oracle import PrefixOracle
from kvbench.workloads.spec import TOKEN_DTYPE, Session, Turn

SHARED_NAMESPACE = "shared"  # the oracle's namespace of what every tenant may reuse
_TENANT_NAMESPACE = "tenant:{}"  # a tenant's own namespace, apart from the shared one whatever its name


class Isolation(enum.StrEnum):
    """What an engine shares across tenants, as the oracle follows it.

    `strict` and `shared-prefix` are our engine's `--isolation` values (kvengine.settings.config.IsolationMode; a test keeps
    them equal, since this room may not import the engine); `shared-all` is every other engine's
    behaviour (vLLM, SGLang, an endpoint: any prefix of any tenant may be reused).
    """

    STRICT = "strict"
    SHARED_PREFIX = "shared-prefix"
    SHARED_ALL = "shared-all"

    @classmethod
    def parse(cls, value: str | Isolation) -> Isolation:
        """The value of a name; `shared` (the harness's name before `shared-prefix` existed) is `shared-all`.
        ValueError names the valid values."""
        if isinstance(value, cls):
            return value
        if value == "shared":
            return cls.SHARED_ALL
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"isolation: unknown {value!r}; use {', '.join(m.value for m in cls)}") from None


SharedPrefix = str | Sequence[int]  # as a tenants file declares one: a text or token ids


def declared_prefix_ids(
    prefixes: Sequence[SharedPrefix], encode: Callable[[str], Sequence[int]] | None = None
) -> tuple[np.ndarray, ...]:
    """A tenants file's `shared_prefixes` as token ids: token ids as given, a text through `encode` (the served
    model's tokenizer). Workloads are token ids, so without a tokenizer a text prefix cannot be found in a
    prompt: ValueError names it rather than silently sharing nothing."""
    out = []
    for i, prefix in enumerate(prefixes):
        if isinstance(prefix, str):
            if encode is None:
                raise ValueError(
                    f"shared_prefixes[{i}]: the text {prefix[:30]!r} needs the served model's tokenizer "
                    "(the client's --tokenizer; the simulator has none): declare it as token ids"
                )
            prefix = encode(prefix)
        out.append(np.asarray(prefix, dtype=TOKEN_DTYPE))
    return tuple(out)


def declared_shared_tokens(prompt: np.ndarray, prefixes: Sequence[np.ndarray]) -> int:
    """How many leading tokens of `prompt` are declared shareable: its longest common prefix with any declared
    prefix. The same rule as our engine's `shared_tokens_of` (core/prefix_index.py; a test holds them equal)."""
    best = 0
    for prefix in prefixes:
        n = min(len(prompt), len(prefix))
        diff = np.flatnonzero(prompt[:n] != prefix[:n])
        best = max(best, int(diff[0]) if len(diff) else n)
    return best


@dataclass(slots=True)
class ReuseOracle:
    """`reusable_tokens` under an engine's isolation rule: how much of a prompt the engine could reuse with an
    unbounded cache, token-exact (a `PrefixOracle` per namespace).

    STRICT: the longest prefix observed in the tenant's own namespace. SHARED_PREFIX: that, or, when the
    prompt begins with a declared prefix, the longest prefix of that declared part observed from any tenant
    (only declared parts are recorded across tenants). SHARED_ALL: the longest prefix observed from anyone.
    """

    isolation: Isolation = Isolation.SHARED_ALL
    shared_prefixes: tuple[np.ndarray, ...] = ()  # token ids; only SHARED_PREFIX reads them
    prefixes: PrefixOracle = field(default_factory=PrefixOracle)

    def __post_init__(self) -> None:
        self.isolation = Isolation.parse(self.isolation)  # a name from a caller's config is checked here

    @classmethod
    def following(
        cls,
        isolation: Isolation | str,
        shared_prefixes: Sequence[SharedPrefix] = (),
        encode: Callable[[str], Sequence[int]] | None = None,
    ) -> ReuseOracle:
        """The oracle of an engine with `isolation` whose tenants file declares `shared_prefixes` (read only in
        shared-prefix isolation, where a text needs `encode`: see `declared_prefix_ids`)."""
        isolation = Isolation.parse(isolation)
        declared = declared_prefix_ids(shared_prefixes, encode) if isolation is Isolation.SHARED_PREFIX else ()
        return cls(isolation, declared)

    def observe(self, tenant: str, tokens: np.ndarray) -> int:
        """The leading tokens of `tokens` that `tenant` could reuse; then records `tokens` as computed."""
        if self.isolation is Isolation.SHARED_ALL:
            return self.prefixes.observe(SHARED_NAMESPACE, tokens)
        own = self.prefixes.observe(_TENANT_NAMESPACE.format(tenant), tokens)
        if self.isolation is Isolation.STRICT:
            return own
        declared = declared_shared_tokens(tokens, self.shared_prefixes)
        if declared == 0:
            return own
        return max(own, self.prefixes.observe(SHARED_NAMESPACE, tokens[:declared]))


def placeholder_tokens(session_id: str, turn: int, length: int, vocab_size: int) -> np.ndarray:
    """Deterministic stand-in answer tokens: the simulator's answers, and the load generator's when a server
    returns neither token ids nor text it can tokenize."""
    low = min(1000, vocab_size // 2)  # clear of the special tokens at the bottom of most vocabularies
    # 32 random bits a token from SHAKE-128 of the turn's id, scaled onto [low, vocab_size) by multiply-shift
    # (bias < span / 2**32): a quarter of the time of a seeded numpy Generator, whose setup and per-call
    # checks were 6% of a long simulation.
    raw = hashlib.shake_128(f"{session_id}/{turn}".encode()).digest(4 * max(length, 0))
    bits = np.frombuffer(raw, np.uint32).astype(np.uint64)
    return ((bits * np.uint64(vocab_size - low)) >> np.uint64(32)).astype(np.int32) + np.int32(low)


def request_id(session_id: str, turn: int) -> str:
    return f"{session_id}/{turn}"


@dataclass(frozen=True)
class Ask:
    """One turn asked: the prompt to send, the turn's spec and what its record says of the asking (the record
    itself is built once the transport answered, by `record_builder`)."""

    turn: int
    spec: Turn
    prompt: np.ndarray
    asked: Asked


@dataclass(slots=True)
class ConversationDriver:
    """One run's conversations: the oracle, the request budget and warmup, and a `Conversation` per session."""

    run_id: str
    load: LoadSpec
    oracle: ReuseOracle = field(default_factory=ReuseOracle)
    sent: int = 0  # requests asked (or replayed) so far

    def start(self, session: Session) -> Conversation:
        return Conversation(session, self)

    def may_send(self, elapsed_s: float) -> bool:
        """Whether another request may be asked `elapsed_s` after the run's start."""
        if self.load.num_requests is not None and self.sent >= self.load.num_requests:
            return False
        return self.load.duration_s is None or elapsed_s < self.load.duration_s


@dataclass(slots=True)
class Conversation:
    """One session's conversation so far, as the next prompt carries it.

    `ask` appends the next user turn and returns the prompt and its record; `answered` appends the engine's
    answer, which the next prompt carries. `replay` takes a turn an interrupted run already finished."""

    session: Session
    driver: ConversationDriver
    turn: int = 0  # the next turn to ask
    _history: list[np.ndarray] = field(default_factory=list)
    _prompt: np.ndarray | None = None

    @property
    def finished(self) -> bool:
        """Every turn has been asked."""
        return self.turn >= len(self.session.turns)

    @property
    def next_request_id(self) -> str:
        return request_id(self.session.session_id, self.turn)

    @property
    def think_time_s(self) -> float:
        """The pause between the previous turn's answer and the next turn (0 before the first turn)."""
        return self.session.turns[self.turn].think_time_s if self.turn else 0.0

    def ask(self, queued_ns: int, planned_ns: int | None = None) -> Ask:
        """Ask the next turn, queued at `queued_ns` on the transport's clock and planned by the schedule at
        `planned_ns` (default: when queued): counts it against the budget."""
        index, spec, prompt, reusable = self._advance()
        session = self.session
        asked = Asked(
            run_id=self.driver.run_id,
            request_id=request_id(session.session_id, index),
            session_id=session.session_id,
            tenant=session.tenant,
            turn=index,
            queued_ns=queued_ns,
            planned_ns=queued_ns if planned_ns is None else planned_ns,
            prompt_len_sent=int(prompt.size),
            reusable_tokens=reusable,
            warmup=self.driver.sent < self.driver.load.warmup_requests,
        )
        self.driver.sent += 1
        return Ask(index, spec, prompt, asked)

    def answered(self, tokens: np.ndarray) -> None:
        """The engine answered the last turn asked with `tokens`."""
        assert self._prompt is not None, "answered before any turn was asked"
        tokens = np.asarray(tokens, dtype=TOKEN_DTYPE)
        self._history.append(tokens)
        # The engine has now computed KV for the prompt and every answer token but the last (which was
        # sampled, never fed back): an unbounded cache could reuse all of that in the next turn.
        self.driver.oracle.observe(self.session.tenant, np.concatenate([self._prompt, tokens[:-1]]))

    def replay(self, record: RequestRecord) -> int:
        """Take the next turn from a finished `record` as if it had just been answered again (counted, observed,
        its recorded answer carried), so later turns get the prompts they would have had: an interrupted run's
        record, or one a load worker sent. Returns the prompt's reusable tokens under this driver's oracle."""
        reusable = self._advance()[3]
        self.driver.sent += 1
        if record.ok:
            self.answered(np.asarray(record.answer_tokens or (), dtype=TOKEN_DTYPE))
        return reusable

    def _advance(self) -> tuple[int, Turn, np.ndarray, int]:
        if self.finished:
            raise ValueError(f"session {self.session.session_id}: every turn has been asked")
        index, spec = self.turn, self.session.turns[self.turn]
        if not self._history:
            self._history.append(self.session.context)
        self._history.append(spec.user_tokens)
        self._prompt = np.concatenate(self._history).astype(TOKEN_DTYPE, copy=False)
        self.turn += 1
        return index, spec, self._prompt, self.driver.oracle.observe(self.session.tenant, self._prompt)
