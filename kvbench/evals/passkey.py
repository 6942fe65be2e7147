"""Passkey retrieval (RULER-style needle in a haystack) over real text: prompts and exact scoring, no torch.

    [instruction] [haystack .......... [needle: "The pass key is 48213. Remember it. ..."] .......]
    [question: "What is the pass key? The pass key is"] [answer: " 48213"]
                                                         ^ scored: the argmax at every answer position

The haystack is consecutive corpus tokens; the needle goes in at `depth` (0 = the start, 1 = just before the
question). A prompt is one teacher-forced forward; it succeeds when the argmax at each answer position is the
answer's token, which is exactly "greedy decoding writes the answer" (each greedy step sees the same prefix).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

INSTRUCTION = (
    "There is an important piece of information hidden inside a lot of irrelevant text. Find it and "
    "memorize it. I will quiz you about it.\n\n"
)
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "\n\nWhat is the pass key? The pass key is "  # the space is its own token before digits
ANSWER = "{key}"
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)


@dataclass(frozen=True)
class PasskeyPrompt:
    """Token ids of one prompt with its answer appended; the answer is `ids[answer_start:]`."""

    length: int  # the target total length in tokens
    depth: float
    key: str
    ids: tuple[int, ...]
    answer_start: int


def passkey_prompts(
    encode: Callable[[str], list[int]],
    haystack: Sequence[int],
    lengths: Sequence[int],
    depths: Sequence[float] = DEPTHS,
    seed: int = 0,
) -> list[PasskeyPrompt]:
    """One prompt per (length, depth), each with its own 5-digit key and its own stretch of the haystack.

    `encode` turns text into token ids without special tokens; `haystack` is the corpus as token ids."""
    rng = random.Random(seed)
    intro, question = encode(INSTRUCTION), encode(QUESTION)
    prompts = []
    offset = 0
    for length in lengths:
        for depth in depths:
            key = str(rng.randint(10000, 99999))
            needle, answer = encode(NEEDLE.format(key=key)), encode(ANSWER.format(key=key))
            filler = length - len(intro) - len(needle) - len(question) - len(answer)
            if filler < 1:
                raise ValueError(f"passkey length {length}: too short for the instruction, needle and question")
            if filler > len(haystack):
                raise ValueError(f"passkey length {length}: the haystack has only {len(haystack)} tokens")
            if offset + filler > len(haystack):
                offset = 0
            text = list(haystack[offset : offset + filler])
            offset += filler
            cut = round(depth * filler)
            ids = intro + text[:cut] + needle + text[cut:] + question + answer
            prompts.append(PasskeyPrompt(length, depth, key, tuple(ids), len(ids) - len(answer)))
    return prompts


def answer_predictions(argmax: Sequence[int], prompt: PasskeyPrompt) -> list[int]:
    """The tokens the model predicts at the answer's positions, from the argmax of every position's logits
    (`argmax[p]` predicts token p + 1)."""
    return [int(argmax[p - 1]) for p in range(prompt.answer_start, len(prompt.ids))]


def retrieved(argmax: Sequence[int], prompt: PasskeyPrompt) -> bool:
    """Every answer token is the argmax: greedy decoding would write the key."""
    return answer_predictions(argmax, prompt) == list(prompt.ids[prompt.answer_start :])
