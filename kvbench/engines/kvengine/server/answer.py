"""One request's answer, accumulated from the engine's outputs and formatted as the OpenAI API does: stream
chunks, the final body, usage (with cached tokens per tier) and logprobs in the completions and chat shapes."""

from __future__ import annotations

import time
import uuid

from kvbench.engines.kvengine.runtime.requests import StepOutput, TokenLogprob
from kvbench.engines.kvengine.server.protocol import ParsedRequest
from kvbench.engines.kvengine.server.text import TextStream


class Answer:
    """Accumulates one request's answer from engine outputs; formats chunks and the final body."""

    def __init__(self, parsed: ParsedRequest, tokenizer, model: str, chat: bool) -> None:
        self.parsed = parsed
        self.tokenizer = tokenizer
        self.model = model
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.text = TextStream(tokenizer, parsed.stop)
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.prompt_logprobs: tuple[TokenLogprob, ...] | None = None
        self.finish_reason: str | None = None
        self.prompt_tokens = len(parsed.generation.prompt_ids)
        self.cached_tokens = 0
        self.cached_by_tier: dict[str, int] | None = None

    def add(self, output: StepOutput) -> str:
        """Apply an engine output; returns the text delta (empty when none)."""
        self.cached_tokens = output.cached_tokens
        if output.cached_tokens_by_tier is not None:
            self.cached_by_tier = output.cached_tokens_by_tier
        if output.prompt_logprobs is not None:
            self.prompt_logprobs = output.prompt_logprobs
        if output.finish_reason is not None:
            self.finish_reason = "stop" if output.finish_reason == "stop" else output.finish_reason
        if output.token_id is None or self.parsed.drop_generated:
            return ""
        self.token_ids.append(output.token_id)
        if output.logprob is not None:
            self.logprobs.append(output.logprob)
        return self.text.add(output.token_id)

    def usage(self) -> dict:
        completion = len(self.token_ids)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "prompt_tokens_details": {
                "cached_tokens": self.cached_tokens,
                "cached_tokens_by_tier": dict(self.cached_by_tier or {}),
            },
        }

    def _decode(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def completion_logprobs(self, entries: list[TokenLogprob], with_prompt: bool) -> dict:
        tokens, values, tops = [], [], []
        if with_prompt:
            prompt = self.parsed.generation.prompt_ids
            tokens.append(self._decode(prompt[0]))
            values.append(None)
            tops.append(None)
            for entry in self.prompt_logprobs or ():
                tokens.append(self._decode(entry.token_id))
                values.append(entry.logprob)
                tops.append(self._top(entry))
        for entry in entries:
            tokens.append(self._decode(entry.token_id))
            values.append(entry.logprob)
            tops.append(self._top(entry))
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": _offsets(tokens)}

    def _top(self, entry: TokenLogprob) -> dict[str, float]:
        top: dict[str, float] = {}
        for token_id, value in entry.top:
            top.setdefault(self._decode(token_id), value)
        return top

    def chat_logprobs(self, entries: list[TokenLogprob]) -> dict:
        return {
            "content": [
                {
                    "token": self._decode(entry.token_id),
                    "logprob": entry.logprob,
                    "top_logprobs": [{"token": self._decode(t), "logprob": v} for t, v in entry.top],
                }
                for entry in entries
            ]
        }

    def chunk(self, delta: str, new_logprobs: list[TokenLogprob], new_ids: list[int], first: bool) -> dict:
        choice: dict = {"index": 0, "finish_reason": None}
        if self.chat:
            choice["delta"] = ({"role": "assistant"} if first else {}) | {"content": delta}
            choice["logprobs"] = self.chat_logprobs(new_logprobs) if self.parsed.logprobs is not None else None
        else:
            echo = self.parsed.echo and first
            text = (self.tokenizer.decode(list(self.parsed.generation.prompt_ids)) if echo else "") + delta
            choice["text"] = text
            choice["logprobs"] = (
                self.completion_logprobs(new_logprobs, with_prompt=echo) if self.parsed.logprobs is not None else None
            )
        if self.parsed.return_token_ids:
            choice["token_ids"] = new_ids
        return {
            "id": self.id,
            "object": self._object(True),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    def final_chunk(self) -> dict:
        choice: dict = {"index": 0, "finish_reason": self.finish_reason}
        choice["delta" if self.chat else "text"] = {} if self.chat else ""
        return {
            "id": self.id,
            "object": self._object(True),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }

    def usage_chunk(self) -> dict:
        return {
            "id": self.id,
            "object": self._object(True),
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": self.usage(),
        }

    def body(self) -> dict:
        choice: dict = {"index": 0, "finish_reason": self.finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": self.text.text}
            choice["logprobs"] = self.chat_logprobs(self.logprobs) if self.parsed.logprobs is not None else None
        else:
            prompt_text = self.tokenizer.decode(list(self.parsed.generation.prompt_ids)) if self.parsed.echo else ""
            choice["text"] = prompt_text + self.text.text
            choice["logprobs"] = (
                self.completion_logprobs(self.logprobs, with_prompt=self.parsed.echo)
                if self.parsed.logprobs is not None
                else None
            )
        if self.parsed.return_token_ids:
            choice["token_ids"] = self.token_ids
            choice["prompt_token_ids"] = list(self.parsed.generation.prompt_ids)
        return {
            "id": self.id,
            "object": self._object(False),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(),
        }

    def _object(self, streaming: bool) -> str:
        if self.chat:
            return "chat.completion.chunk" if streaming else "chat.completion"
        return "text_completion"


def _offsets(tokens: list[str]) -> list[int]:
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return offsets
