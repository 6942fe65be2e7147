"""The OpenAI-compatible request bodies our engine accepts, validated into `GenerationRequest`s.

Every bad field gets a 400 with a message naming the field and the fix (`RequestError`). Extensions that
vLLM users know are accepted: `ignore_eos`, `return_token_ids`, `top_k` -1 or 0 (off; others are refused),
token-id prompts. Numbers must be finite (Python's JSON reader accepts NaN and Infinity); a temperature below
`GREEDY_BELOW_TEMPERATURE` (1e-5, vLLM's _SAMPLING_EPS) is served greedily, as vLLM does. Booleans are JSON
booleans (`"yes"` and `1` are refused). A field this engine would otherwise ignore (`UNSUPPORTED`: best_of > 1,
penalties, logit_bias, tools, ...) is refused with a 400 naming it unless it holds its no-op value; `user` and
`metadata` are accepted and change nothing (they describe the caller, not the output).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from kvbench.engines.kvengine.model.sampling import SEED_RANGE, SamplingParams
from kvbench.engines.kvengine.runtime.requests import GenerationRequest
from kvbench.settings import shown

MAX_LOGPROBS = 20
# A text prompt longer than this many characters per token of the model's context cannot fit (no tokenizer
# we serve averages longer tokens), so it is refused before tokenising: tokenising 20 MB took 31 s.
MAX_CHARS_PER_TOKEN = 64
# A body's bytes per token of context: 64 characters, each at most a 6-byte JSON escape (\u0000), plus room
# for the other fields. A longer body gets 413 (aiohttp stops reading at the limit).
MAX_BODY_BYTES_PER_TOKEN = MAX_CHARS_PER_TOKEN * 6
BODY_OVERHEAD_BYTES = 1 << 20
# Stop strings: each is searched for in the text after every token, so their count and length bound that work.
# OpenAI takes up to 4; vLLM sets no bound (300,000 strings held its event loop 25 s).
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 4096  # all of them together
MAX_INT = 2**63 - 1  # an integer field past it is refused before a limit check quotes all its digits
_ids = itertools.count()


def _absent_or(*no_ops: object):
    return lambda value: value is None or any(value == v and type(value) is type(v) for v in no_ops)


# Fields of the OpenAI (and vLLM) APIs this engine does not implement: each with the values that mean "off".
# Any other value is refused (400 naming the field) rather than silently ignored.
UNSUPPORTED = {
    "best_of": _absent_or(1),
    "presence_penalty": _absent_or(0, 0.0),
    "frequency_penalty": _absent_or(0, 0.0),
    "repetition_penalty": _absent_or(1, 1.0),
    "min_p": _absent_or(0, 0.0),
    "min_tokens": _absent_or(0),
    "logit_bias": _absent_or({}),
    "suffix": _absent_or(""),
    "use_beam_search": _absent_or(False),
    "tools": _absent_or([]),
    "tool_choice": _absent_or("none"),
    "functions": _absent_or([]),
    "function_call": _absent_or("none"),
    "response_format": lambda value: value is None or value == {"type": "text"},
    "guided_json": _absent_or(),
    "guided_regex": _absent_or(),
    "guided_choice": _absent_or(),
    "guided_grammar": _absent_or(),
}


def max_prompt_chars(max_model_len: int) -> int:
    """The most characters of prompt text (all chat messages together) worth tokenising for this context."""
    return max_model_len * MAX_CHARS_PER_TOKEN


def max_body_bytes(max_model_len: int) -> int:
    """The largest request body a server for this context accepts (aiohttp's client_max_size)."""
    return max_model_len * MAX_BODY_BYTES_PER_TOKEN + BODY_OVERHEAD_BYTES


class RequestError(ValueError):
    """A request the server refuses; `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.param = param
        self.status = status
        self.kind = kind


@dataclass(frozen=True)
class ParsedRequest:
    """A generation plus what the response needs to know about how it was asked."""

    generation: GenerationRequest
    stream: bool
    include_usage: bool
    echo: bool
    stop: tuple[str, ...]
    return_token_ids: bool
    logprobs: int | None
    drop_generated: bool  # max_tokens 0 with echo: score the prompt only (lm-eval's loglikelihood)


def parse_completion(body: Mapping, tokenizer, tenant: str, max_chars: int) -> ParsedRequest:
    """`max_chars`: the longest text prompt worth tokenising (`max_prompt_chars`)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        check_chars(len(prompt), max_chars, "prompt")
        prompt_ids = tuple(tokenizer(prompt)["input_ids"])
    elif isinstance(prompt, list) and prompt and all(_is_int(token) for token in prompt):
        prompt_ids = tuple(prompt)
    else:
        raise RequestError("prompt: give a string or a non-empty list of token ids (one prompt per request)", "prompt")
    echo = _bool(body, "echo", False)
    logprobs = _optional_int(body, "logprobs", 0, MAX_LOGPROBS)
    max_tokens = _int(body, "max_tokens", 16, 0 if echo else 1)
    return _parsed(body, prompt_ids, max_tokens, logprobs, echo, tenant)


def parse_chat(body: Mapping, chat_prompt_ids, tenant: str, max_chars: int) -> ParsedRequest:
    """`max_chars`: the longest text (all messages) worth tokenising (`max_prompt_chars`)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: give a non-empty list of {role, content} objects", "messages")
    for index, message in enumerate(messages):
        if not (
            isinstance(message, Mapping)
            and isinstance(message.get("content"), str)
            and isinstance(message.get("role"), str)
        ):
            raise RequestError(
                f"messages[{index}]: each message needs a string 'role' and a string 'content'", "messages"
            )
    check_chars(sum(len(m["content"]) + len(m["role"]) for m in messages), max_chars, "messages")
    prompt_ids = tuple(chat_prompt_ids([{"role": m["role"], "content": m["content"]} for m in messages]))
    want = _bool(body, "logprobs", False)
    top = _optional_int(body, "top_logprobs", 0, MAX_LOGPROBS)
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    max_tokens = _int({"max_tokens": limit}, "max_tokens", 256, 1)
    return _parsed(body, prompt_ids, max_tokens, (top or 0) if want else None, False, tenant)


def _parsed(
    body: Mapping, prompt_ids: tuple[int, ...], max_tokens: int, logprobs: int | None, echo: bool, tenant: str
) -> ParsedRequest:
    check_unsupported(body)
    if _int(body, "n", 1, 1) != 1:
        raise RequestError("n: only n=1 is supported", "n")
    temperature = _float(body, "temperature", 1.0, 0.0)  # below GREEDY_BELOW_TEMPERATURE: greedy
    top_p = _float(body, "top_p", 1.0, 0.0)
    if not 0 < top_p <= 1:
        raise RequestError(f"top_p: must be in (0, 1], got {shown(top_p)}", "top_p")
    top_k = _int(body, "top_k", -1, -1)
    if top_k > 0:
        raise RequestError(f"top_k: not supported by this engine; omit it or send -1 (got {shown(top_k)})", "top_k")
    seed = body.get("seed")
    if seed is not None:
        low, high = SEED_RANGE
        if not isinstance(seed, int) or isinstance(seed, bool) or not low <= seed <= high:
            raise RequestError(f"seed: must be an integer in [{low}, {high}], got {shown(seed)}", "seed")
    stop = body.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise RequestError("stop: give a string or a list of strings", "stop")
    if len(stop) > MAX_STOP_STRINGS or sum(map(len, stop)) > MAX_STOP_CHARS:
        raise RequestError(
            f"stop: {len(stop)} strings of {sum(map(len, stop))} characters; at most "
            f"{MAX_STOP_STRINGS} strings of {MAX_STOP_CHARS} characters together: send fewer",
            "stop",
        )
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(_is_int(t) for t in stop_ids):
        raise RequestError("stop_token_ids: give a list of token ids", "stop_token_ids")
    options = body.get("stream_options") or {}
    if not isinstance(options, Mapping):
        raise RequestError("stream_options: must be an object", "stream_options")
    generation = GenerationRequest(
        request_id=f"cmpl-{next(_ids)}",
        prompt_ids=prompt_ids,
        max_tokens=max(max_tokens, 1),
        sampling=SamplingParams(temperature=temperature, top_p=top_p, seed=seed),
        stop_token_ids=frozenset(stop_ids),
        ignore_eos=_bool(body, "ignore_eos", False),
        logprobs=logprobs,
        prompt_logprobs=logprobs if echo and logprobs is not None else None,
        tenant=tenant,
    )
    return ParsedRequest(
        generation=generation,
        stream=_bool(body, "stream", False),
        include_usage=_bool(options, "include_usage", False, "stream_options.include_usage"),
        echo=echo,
        stop=tuple(stop),
        return_token_ids=_bool(body, "return_token_ids", False),
        logprobs=logprobs,
        drop_generated=echo and max_tokens == 0,
    )


def check_unsupported(body: Mapping) -> None:
    """A 400 naming every field whose value this engine would have to ignore."""
    named = sorted(name for name, no_op in UNSUPPORTED.items() if not no_op(body.get(name)))
    if named:
        them = "them" if len(named) > 1 else "it"
        raise RequestError(
            f"{', '.join(named)}: not supported by this engine; omit {them} (or send the default: "
            "best_of 1, penalties 0, no tools)",
            named[0],
        )


def check_chars(count: int, max_chars: int, name: str) -> None:
    if count > max_chars:
        raise RequestError(
            f"{name}: {count} characters cannot fit the model's context of "
            f"{max_chars // MAX_CHARS_PER_TOKEN} tokens (at most {max_chars} characters are "
            "tokenised); shorten it",
            name,
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bool(body: Mapping, name: str, default: bool, label: str | None = None) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        label = label or name
        raise RequestError(f"{label}: must be true or false, got {shown(value)}", label)
    return value


def _int(body: Mapping, name: str, default: int, minimum: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value):
        raise RequestError(f"{name}: must be an integer, got {shown(value)}", name)
    if value < minimum:
        raise RequestError(f"{name}: must be >= {minimum}, got {shown(value)}", name)
    if value > MAX_INT:
        raise RequestError(f"{name}: at most 2**63 - 1, got {shown(value)}", name)
    return value


def _optional_int(body: Mapping, name: str, minimum: int, maximum: int) -> int | None:
    if body.get(name) is None:
        return None
    value = _int(body, name, 0, minimum)
    if value > maximum:
        raise RequestError(f"{name}: at most {maximum}, got {shown(value)}", name)
    return value


def _float(body: Mapping, name: str, default: float, minimum: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise RequestError(f"{name}: must be a number, got {shown(value)}", name)
    number = float(value) if isinstance(value, float) or abs(value) < 2**1000 else math.inf
    if not math.isfinite(number):
        raise RequestError(f"{name}: must be a finite number, got {shown(value)}", name)
    if number < minimum:
        raise RequestError(f"{name}: must be >= {minimum}, got {shown(value)}", name)
    return number
