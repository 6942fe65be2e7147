"""What a conversation's next prompt carries, as the load generator sends it: the answer as tokens (the server's
token ids, else its text re-tokenized by the workload's `TextCodec`, else placeholders of its length; the record
says which), and, for api=chat, the same turns as text messages (`ChatPrompt`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvbench.measure.answer import Answer
from kvbench.measure.conversation import Ask, placeholder_tokens
from kvbench.measure.record_builder import NextTurn
from kvbench.measure.records import ANSWER_PLACEHOLDER, ANSWER_RETOKENIZED, ANSWER_TOKEN_IDS
from kvbench.workloads.spec import Session


class TextCodec(Protocol):
    """A tokenizer seen from the client: only for re-tokenizing answers and for text (chat) prompts."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


def answer_as_next_turn(answer: Answer, ask: Ask, codec: TextCodec | None, vocab_size: int, chat: bool) -> NextTurn:
    """What the next prompt carries as this answer: its token ids, else its text re-tokenized, else
    placeholders of its length."""
    text = answer.text if chat else None
    if answer.token_ids:
        return NextTurn(ANSWER_TOKEN_IDS, list(answer.token_ids), text)
    if codec is not None and answer.text:
        return NextTurn(ANSWER_RETOKENIZED, list(codec.encode(answer.text)), text)
    usage = answer.usage
    length = (
        usage.completion_tokens
        if usage is not None and usage.completion_tokens is not None
        else sum(n for _, n in answer.chunks or ())
    )
    tokens = placeholder_tokens(ask.asked.session_id, ask.turn, length, vocab_size)
    return NextTurn(ANSWER_PLACEHOLDER, tokens.tolist(), text)


@dataclass(slots=True)
class ChatPrompt:
    """The chat form (api=chat) of a conversation's prompt: the same turns as text messages, the context as a
    system message and each answer as the text the server sent."""

    codec: TextCodec
    session: Session
    messages: list[dict] = field(default_factory=list)

    def asked(self, turn: int) -> None:
        if turn == 0 and self.session.context.size:
            self.messages = [{"role": "system", "content": self.codec.decode(self.session.context.tolist())}]
        user = self.session.turns[turn].user_tokens
        self.messages = self.messages + [{"role": "user", "content": self.codec.decode(user.tolist())}]

    def answered(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})
