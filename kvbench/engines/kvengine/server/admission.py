"""What a request may cost before any of it is spent: checks that run on the event loop, in time linear in the
body's bytes, before the body is parsed deeper or a character of it is tokenised.

- JSON shape: Python's JSON reader recurses once per level, so a body nested 100,000 deep raised
  RecursionError (a 500 and a traceback); and it holds the GIL while it builds objects (0.3 s for a chat of
  100,000 messages, during which the event loop answers nobody). `check_json_shape` refuses more than
  `MAX_JSON_DEPTH` levels (no OpenAI request needs more than a handful) and more than `MAX_JSON_CONTAINERS`
  objects and arrays, from the body's bytes as UTF-8 (`admitted_json`), before `json.loads` sees them.
- Chat size: a chat of 100,000 one-character messages is short text but a long templated prompt (900,011
  tokens with the tiny model's template, 3.6 s of tokenising before its refusal). `check_messages` caps the
  count at `MAX_MESSAGES` (2048, the OpenAI API's own cap on `messages`) and bounds the templated length
  from above by `TemplateCost` (fixed characters + per-message characters x messages + the messages' own
  characters), refused against the characters the model's context could hold (`protocol.max_prompt_chars`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kvbench.engines.kvengine.server.protocol import RequestError, check_chars

MAX_JSON_DEPTH = 64
MAX_MESSAGES = 2048  # the OpenAI API's maximum length of `messages`
MAX_JSON_CONTAINERS = 4 * MAX_MESSAGES + 256  # a full chat whose messages carry content parts, plus tools


def admitted_json(raw: bytes) -> bytes:
    """`raw` as UTF-8 with its JSON shape checked (`check_json_shape`): the bytes `json.loads` may read.

    JSON may come as UTF-16 or UTF-32 (Python's reader tells them by their null bytes, RFC 8259 section 8.1).
    The shape is counted on bytes where a bracket is one byte and a quote is a quote, so a body in another
    encoding is decoded to text, and re-encoded as UTF-8, before any bound is checked: counted on its own
    bytes, a UTF-16 body nested 100,000 deep passed (500, RecursionError) and 300,000 `{}` were let in."""
    encoding = json.detect_encoding(raw)
    if encoding != "utf-8":
        try:
            raw = raw.decode(encoding).encode("utf-8")
        except UnicodeError:
            raise RequestError(
                f"the body is not valid {encoding} text (JSON must be UTF-8, UTF-16 or UTF-32); send UTF-8"
            ) from None
    check_json_shape(raw)
    return raw


def check_json_shape(raw: bytes, depth_limit: int = MAX_JSON_DEPTH, count_limit: int = MAX_JSON_CONTAINERS) -> None:
    """RequestError when `raw` nests arrays/objects deeper than `depth_limit` or holds more than `count_limit`
    of them (brackets inside strings not counted)."""
    if raw.count(b"[") + raw.count(b"{") <= min(depth_limit, count_limit):
        return  # cannot nest deeper, or hold more, than it has brackets: most bodies stop here
    data = np.frombuffer(raw, dtype=np.uint8)
    opening = (data == ord("[")) | (data == ord("{"))  # (np.isin sorts: 5x slower)
    brackets = np.flatnonzero(opening | (data == ord("]")) | (data == ord("}")))
    brackets = brackets[_outside_strings(data, brackets)]
    opens = opening[brackets]
    depth = int(np.cumsum(np.where(opens, 1, -1)).max(initial=0))
    if depth > depth_limit:
        raise RequestError(
            f"the body nests JSON {depth} levels deep; at most {depth_limit} are accepted (a request "
            "needs a handful): flatten it"
        )
    if int(opens.sum()) > count_limit:
        raise RequestError(
            f"the body holds {int(opens.sum())} JSON objects and arrays; at most {count_limit} are "
            f"accepted (a chat holds at most {MAX_MESSAGES} messages): send less"
        )


def _outside_strings(data: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Whether each of `positions` (sorted byte indexes) lies outside every JSON string: an even number of
    unescaped quotes before it. A quote is escaped after an odd run of backslashes. Vectorised: a regex over
    the 200,000 strings of a 100,000-message chat held the GIL 0.5 s."""
    quotes = np.flatnonzero(data == ord('"'))
    if quotes.size and np.any(data[np.maximum(quotes - 1, 0)] == ord("\\")):
        index = np.arange(data.size, dtype=np.int32)
        last_other = np.maximum.accumulate(np.where(data == ord("\\"), -1, index))
        run_before = index[quotes] - 1 - last_other[np.maximum(quotes - 1, 0)]  # backslashes just before
        quotes = quotes[(quotes == 0) | (run_before % 2 == 0)]
    return np.searchsorted(quotes, positions) % 2 == 0


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
            text = tokenizer.apply_chat_template(
                [{"role": r, "content": ""} for r in roles], tokenize=False, add_generation_prompt=True
            )
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
        raise RequestError(
            f"messages: {len(messages)} messages; at most {MAX_MESSAGES} per request (as the OpenAI API): send fewer",
            "messages",
        )
    for index, message in enumerate(messages):
        if not (
            isinstance(message, Mapping)
            and isinstance(message.get("content"), str)
            and isinstance(message.get("role"), str)
        ):
            raise RequestError(
                f"messages[{index}]: each message needs a string 'role' and a string 'content'", "messages"
            )
    bound = template.bound(messages)
    if bound > max_chars:
        raise RequestError(
            f"messages: the chat template makes about {bound} characters of {len(messages)} "
            f"messages, more than the model's context can hold ({max_chars} characters are "
            "tokenised at most); shorten it",
            "messages",
        )
    return bound


def check_prompt(body: Mapping, max_chars: int) -> int:
    """Characters a completion body asks to tokenise (0 for token ids; the parser refuses other shapes), or
    RequestError naming `prompt` beyond what the context holds."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    chars = len(prompt) if isinstance(prompt, str) else 0
    check_chars(chars, max_chars, "prompt")
    return chars
