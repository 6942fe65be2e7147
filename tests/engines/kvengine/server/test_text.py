"""Streamed text (issue 46): deltas that add up to the whole decode, stop strings cut where they first end,
and each token decoding a short window, so an answer costs time linear in its length (a whole decode
after every token made an 8,000-token answer 30 s of event-loop time)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.engines.kvengine.runtime.tiny import byte_tokenizer
from kvbench.engines.kvengine.server.text import TextStream

TOKENIZER = byte_tokenizer()  # one token per byte: multi-byte characters arrive in pieces


def ids_of(text: str) -> list[int]:
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]


def streamed(text: str, stop: tuple[str, ...] = ()) -> tuple[str, TextStream]:
    stream = TextStream(TOKENIZER, stop)
    return "".join(stream.add(t) for t in ids_of(text)), stream


def first_stop(text: str, stop: tuple[str, ...]) -> str:
    """The text as a reader stopping at the first stop string to appear, character by character, sees it."""
    for end in range(1, len(text) + 1):
        found = [text[:end].find(s) for s in stop if s and s in text[:end]]
        if found:
            return text[: min(found)]
    return text


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_the_deltas_add_up_to_the_whole_decode(text):
    deltas, stream = streamed(text)
    assert deltas == stream.text == TOKENIZER.decode(ids_of(text), skip_special_tokens=True)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abcé", max_size=40), st.lists(st.text(alphabet="abcé", min_size=1, max_size=4), max_size=4))
def test_the_text_ends_before_the_first_stop_string(text, stop):
    _, stream = streamed(text, tuple(stop))
    assert stream.text == first_stop(text, tuple(stop))
    assert stream.stopped == (stream.text != text or any(s in text for s in stop))


def test_a_stop_that_began_in_text_already_sent_is_cut_from_the_answer():
    deltas, stream = streamed("the cache keeps pages", ("keeps",))
    assert deltas == "the cache keep" and stream.text == "the cache " and stream.stopped


@pytest.mark.parametrize("length", [100, 4000])
def test_each_token_decodes_a_window_of_a_few_tokens_whatever_the_length(length):
    decoded: list[int] = []

    class Counting:
        def decode(self, ids, skip_special_tokens):
            decoded.append(len(ids))
            return TOKENIZER.decode(ids, skip_special_tokens=skip_special_tokens)

    stream = TextStream(Counting(), ("never",))
    for token in ids_of("é and ascii " * (length // 12)):
        stream.add(token)
    assert max(decoded) <= 3  # a 2-byte character and the token before it
