"""The one place a `RequestRecord` is made: from a turn as it was asked (`Asked`), the transport's `Answer`, and
what the next turn carries as this one's answer (`NextTurn`). No other module sets a record's fields
(tests/measure/test_record_builder.py checks that by reading the source); past here a record is read, written
to disk, or moved onto another clock (`RequestRecord.shift_times`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from kvbench.measure.answer import Answer
from kvbench.measure.records import RequestRecord


@dataclass(frozen=True, slots=True)
class Asked:
    """One turn as the conversation asked it: which request, when the schedule meant it to go (`planned_ns`)
    and when it could (`queued_ns`), its prompt's length, the tokens of it an unbounded cache could reuse, and
    whether it is warm-up."""

    run_id: str
    request_id: str
    session_id: str
    tenant: str
    turn: int
    queued_ns: int
    planned_ns: int
    prompt_len_sent: int
    reusable_tokens: int
    warmup: bool


@dataclass(frozen=True, slots=True)
class NextTurn:
    """What the session's next prompt carries as this turn's answer, and where it came from (`ANSWER_*`);
    `tokens` None: not kept in the record (the simulator's, which replays its own placeholders)."""

    source: str
    tokens: list[int] | None
    text: str | None = None


def build_record(asked: Asked, answer: Answer, next_turn: NextTurn | None = None) -> RequestRecord:
    """The record of `asked`, answered (or failed) as `answer` says."""
    usage, failure = answer.usage, answer.failure
    return RequestRecord(
        run_id=asked.run_id,
        request_id=asked.request_id,
        session_id=asked.session_id,
        tenant=asked.tenant,
        turn=asked.turn,
        queued_ns=asked.queued_ns,
        planned_ns=asked.planned_ns,
        sent_ns=answer.sent_ns,
        first_token_ns=answer.first_token_ns,
        done_ns=answer.done_ns,
        chunks=answer.chunks if answer.chunks is not None else [],
        prompt_tokens=usage.prompt_tokens if usage else None,
        output_tokens=usage.completion_tokens if usage else None,
        cached_tokens=usage.cached_tokens if usage else None,
        cached_tokens_by_tier=dict(usage.cached_tokens_by_tier)
        if usage and usage.cached_tokens_by_tier is not None
        else None,
        prompt_len_sent=asked.prompt_len_sent,
        reusable_tokens=asked.reusable_tokens,
        answer_source=next_turn.source if next_turn else None,
        http_status=answer.http_status,
        error=None if failure is None else str(failure),
        error_kind=None if failure is None else failure.kind,
        warmup=asked.warmup,
        finish_reason=answer.finish_reason,
        answer_tokens=next_turn.tokens if next_turn else None,
        answer_text=next_turn.text if next_turn else None,
    )


def with_reusable_tokens(record: RequestRecord, reusable_tokens: int) -> RequestRecord:
    """`record` with the reusable tokens counted by this process's oracle (a load worker's record, replayed)."""
    return dataclasses.replace(record, reusable_tokens=reusable_tokens)
