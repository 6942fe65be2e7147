"""PrefixOracle: hand-checked prefixes, namespace isolation, and agreement with a brute-force reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.workloads.oracle import PrefixOracle


def ids(*values):
    return np.array(values, dtype=np.int32)


def test_first_observation_reuses_nothing_and_a_repeat_reuses_everything():
    oracle = PrefixOracle(block_tokens=4)
    assert oracle.observe("t", ids(1, 2, 3, 4, 5, 6)) == 0
    assert oracle.observe("t", ids(1, 2, 3, 4, 5, 6)) == 6


def test_partial_block_matches_count_token_exactly():
    oracle = PrefixOracle(block_tokens=4)
    oracle.observe("t", ids(1, 2, 3, 4, 5, 6, 7, 8, 9, 10))
    # One full block (4) plus 2 tokens into the second block, then a difference.
    assert oracle.observe("t", ids(1, 2, 3, 4, 5, 6, 99, 8)) == 6
    # A prefix shorter than one block.
    assert oracle.observe("t", ids(1, 2, 77)) == 2
    # A sequence that is a strict prefix of an earlier one, ending mid-block.
    assert oracle.observe("t", ids(1, 2, 3, 4, 5, 6, 7)) == 7
    # Extending past everything seen: only the seen part counts.
    assert oracle.observe("t", ids(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)) == 10


def test_a_short_tail_seen_earlier_is_matched_by_a_longer_sequence():
    oracle = PrefixOracle(block_tokens=4)
    oracle.observe("t", ids(1, 2, 3, 4, 5, 6))  # tail (5, 6) is a partial block
    assert oracle.observe("t", ids(1, 2, 3, 4, 5, 6, 7, 8, 9)) == 6
    assert oracle.observe("t", ids(1, 2, 3, 4, 5, 9)) == 5


def test_the_longest_of_several_continuations_wins():
    oracle = PrefixOracle(block_tokens=4)
    oracle.observe("t", ids(1, 2, 3, 4, 5, 6, 0, 0))
    oracle.observe("t", ids(1, 2, 3, 4, 5, 6, 7, 0))
    oracle.observe("t", ids(1, 2, 3, 4, 8))
    assert oracle.observe("t", ids(1, 2, 3, 4, 5, 6, 7, 7)) == 7


def test_namespaces_are_isolated():
    oracle = PrefixOracle(block_tokens=4)
    oracle.observe("tenant-a", ids(1, 2, 3, 4, 5))
    assert oracle.observe("tenant-b", ids(1, 2, 3, 4, 5)) == 0
    assert oracle.observe("tenant-a", ids(1, 2, 3, 4, 5)) == 5
    assert oracle.observe("tenant-b", ids(1, 2, 3, 4, 5)) == 5


def test_empty_sequence():
    oracle = PrefixOracle(block_tokens=4)
    assert oracle.observe("t", ids()) == 0
    oracle.observe("t", ids(1, 2))
    assert oracle.observe("t", ids()) == 0


def test_rejects_a_block_size_below_one():
    with pytest.raises(ValueError, match="block_tokens"):
        PrefixOracle(block_tokens=0)


def brute_force(history, tokens):
    best = 0
    for earlier in history:
        n = min(len(earlier), len(tokens))
        k = 0
        while k < n and earlier[k] == tokens[k]:
            k += 1
        best = max(best, k)
    return best


# Few distinct ids so that sequences share prefixes of every length, including across block boundaries.
sequences = st.lists(st.lists(st.integers(0, 2), max_size=20), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(sequences, st.integers(1, 5))
def test_agrees_with_brute_force_for_any_block_size(seqs, block_tokens):
    oracle = PrefixOracle(block_tokens=block_tokens)
    history = []
    for seq in seqs:
        assert oracle.observe("t", np.array(seq, dtype=np.int32)) == brute_force(history, seq)
        history.append(seq)
