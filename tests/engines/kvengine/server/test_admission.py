"""The admission checks' arithmetic against Python's own reading: JSON depth and object counts from raw bytes
(strings with quotes, backslashes and brackets in them), and the chat template's length bound."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.engines.kvengine.runtime.tiny import byte_tokenizer
from kvbench.engines.kvengine.server.admission import TemplateCost, check_json_shape
from kvbench.engines.kvengine.server.protocol import RequestError

TEXT = st.text(alphabet='[]{}"\\ax\n', max_size=8)
VALUES = st.recursive(
    st.none() | st.integers() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=40,
)


def depth_and_count(value) -> tuple[int, int]:
    if isinstance(value, list | dict):
        children = [depth_and_count(v) for v in (value.values() if isinstance(value, dict) else value)]
        return 1 + max((d for d, _ in children), default=0), 1 + sum(c for _, c in children)
    return 0, 0


@settings(max_examples=300, deadline=None)
@given(VALUES, st.booleans())
def test_depth_and_object_count_are_read_from_the_bytes_as_json_reads_them(value, ascii_only):
    raw = json.dumps(value, ensure_ascii=ascii_only).encode()
    depth, count = depth_and_count(value)
    check_json_shape(raw, depth_limit=depth, count_limit=count)  # exactly at the limits: accepted
    if depth:
        with pytest.raises(RequestError, match="levels deep"):
            check_json_shape(raw, depth_limit=depth - 1, count_limit=count)
        with pytest.raises(RequestError, match="objects and arrays"):
            check_json_shape(raw, depth_limit=depth, count_limit=count - 1)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["user", "assistant", "system", "x"]), st.text(max_size=30)), min_size=1, max_size=20
    )
)
def test_the_template_bound_is_never_below_the_templated_text(messages):
    tokenizer = byte_tokenizer()
    chat = [{"role": role, "content": content} for role, content in messages]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    bound = TemplateCost.measure(tokenizer).bound(chat)
    assert bound == len(text)  # an upper bound; exact for a template linear in its messages (ChatML)
