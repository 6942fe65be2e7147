"""What a request may cost before any of it is spent: checks that run on the event loop, in time linear in the
body's bytes, before the body is parsed deeper or a character of it is tokenised.

- JSON depth: Python's JSON reader recurses once per level, so a body nested 100,000 deep raised
  RecursionError (a 500 and a traceback). `check_json_depth` refuses more than `MAX_JSON_DEPTH` levels (no
  OpenAI request needs more than a handful) from the raw bytes, before `json.loads` sees them.
- Chat size: a chat of 100,000 one-character messages is short text but a long templated prompt (900,011
  tokens with the tiny model's template, 3.6 s of tokenising before its refusal). `check_messages` caps the
  count at `MAX_MESSAGES` (2048, the OpenAI API's own cap on `messages`) and bounds the templated length
  from above by `TemplateCost` (fixed characters + per-message characters x messages + the messages' own
  characters), refused against the characters the model's context could hold (`protocol.max_prompt_chars`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kvbench.engines.kvengine.server.protocol import RequestError

MAX_JSON_DEPTH = 64
MAX_MESSAGES = 2048  # the OpenAI API's maximum length of `messages`
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def check_json_depth(raw: bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """RequestError when `raw` nests arrays/objects deeper than `limit` (brackets inside strings not counted)."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return  # cannot nest deeper than it has brackets: most bodies stop here
    data = np.frombuffer(_STRING.sub(b'""', raw), dtype=np.uint8)
    step = np.isin(data, (ord("["), ord("{"))).astype(np.int32) - np.isin(data, (ord("]"), ord("}")))
    depth = int(np.cumsum(step).max(initial=0))
    if depth > limit:
        raise RequestError(f"the body nests JSON {depth} levels deep; at most {limit} are accepted (a request needs "
                           "a handful): flatten it", status=400)


@dataclass(frozen=True)
class TemplateCost:
    """Characters a chat template adds: `fixed` once (the generation prompt), `per_message` around each message
    (beyond its role and content). Zero for a tokenizer without a template: then only the messages count."""

    fixed: int = 0
    per_message: int = 0

    @classmethod
    def measure(cls, tokenizer) -> TemplateCost:
        """Rendered once at start: one user message, then user-assistant-user, all empty."""
        def chars(roles: list[str]) -> int:
            text = tokenizer.apply_chat_template([{"role": r, "content": ""} for r in roles], tokenize=False,
                                                 add_generation_prompt=True)
            return len(text) - sum(map(len, roles))

        try:
            one, three = chars(["user"]), chars(["user", "assistant", "user"])
        except Exception:  # noqa: BLE001 - no template, or one that refuses these roles: count messages only
            return cls()
        per_message = max((three - one) // 2, 0)
        return cls(max(one - per_message, 0), per_message)

    def bound(self, messages: list[Mapping]) -> int:
        """An upper bound of the templated text's characters."""
        own = sum(len(m["role"]) + len(m["content"]) for m in messages)
        return self.fixed + self.per_message * len(messages) + own


def check_messages(body: Mapping, template: TemplateCost, max_chars: int) -> int:
    """The templated length bound of a chat body's messages, or RequestError naming `messages`."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: give a non-empty list of {role, content} objects", "messages")
    if len(messages) > MAX_MESSAGES:
        raise RequestError(f"messages: {len(messages)} messages; at most {MAX_MESSAGES} per request (as the OpenAI "
                           "API): send fewer", "messages")
    for index, message in enumerate(messages):
        if not (isinstance(message, Mapping) and isinstance(message.get("content"), str)
                and isinstance(message.get("role"), str)):
            raise RequestError(f"messages[{index}]: each message needs a string 'role' and a string 'content'",
                               "messages")
    bound = template.bound(messages)
    if bound > max_chars:
        raise RequestError(f"messages: the chat template makes about {bound} characters of {len(messages)} "
                           f"messages, more than the model's context can hold ({max_chars} characters are "
                           "tokenised at most); shorten it", "messages")
    return bound


def prompt_chars(body: Mapping) -> int:
    """Characters a completion body asks to tokenise (0 for token ids; the parser refuses other shapes)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    return len(prompt) if isinstance(prompt, str) else 0
