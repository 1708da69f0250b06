"""StopMatcher: holdback of stop prefixes and the cut at the first stop string."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from frontend.text.stops import StopMatcher


def reference_cut(text: str, stops: list[str]) -> tuple[str, bool]:
    """Grow the text one character at a time; cut at the first stop that completes."""
    stops = [s for s in stops if s]
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if text[:end].endswith(s)]
        if ending:
            return text[: end - max(len(s) for s in ending)], True
    return text, False


def run(pieces: list[str], stops: list[str]) -> tuple[list[str], bool]:
    matcher = StopMatcher(stops)
    out = [matcher.push(p) for p in pieces]
    out.append(matcher.finish())
    return out, matcher.stopped


@pytest.mark.parametrize(
    ("pieces", "stops", "expected", "stopped"),
    [
        # The worked example: "de" split across tokens stops at "bc".
        (["b", "c", "d", "e", "f"], ["de"], ["b", "c", "", "", "", ""], True),
        # A held prefix that turns out not to be a stop is released.
        (["b", "d", "x"], ["de"], ["b", "", "dx", ""], False),
        # Held back until the end of generation, then released by finish().
        (["a", "d"], ["de"], ["a", "", "d"], False),
        # Stop inside one piece: only the text before it is sent.
        (["hello world"], ["o w"], ["hell", ""], True),
        # Earliest of several stops wins.
        (["xaybz"], ["b", "a"], ["x", ""], True),
        # After stopping, nothing more comes out.
        (["ab", "cd"], ["b"], ["a", "", ""], True),
        # No stops: everything passes straight through.
        (["ab", "cd"], [], ["ab", "cd", ""], False),
        # Overlapping: "bc" completes before "abcd" would, so it wins.
        (["abc", "d"], ["abcd", "bc"], ["a", "", ""], True),
        (["abcd"], ["abcd", "bc"], ["a", ""], True),
        # Longest proper-prefix suffix is held: "aa" could start "aab".
        (["xaa"], ["aab"], ["x", "aa"], False),
        # Empty stop strings are ignored.
        (["abc"], ["", "z"], ["abc", ""], False),
        # Stop at the very start.
        (["<e", "nd>rest"], ["<end>"], ["", "", ""], True),
    ],
)
def test_stop_matcher_table(
    pieces: list[str], stops: list[str], expected: list[str], stopped: bool
) -> None:
    out, did_stop = run(pieces, stops)
    assert out == expected
    assert did_stop == stopped


def test_holds_back_only_prefixes_byte_by_byte() -> None:
    matcher = StopMatcher(["\nUser:"])
    sent = [matcher.push(c) for c in "Hi\nUs"]
    assert "".join(sent) == "Hi"  # "\nUs" could be the start of the stop
    assert matcher.push("a") == "\nUsa"
    assert not matcher.stopped


alphabet = st.text(alphabet="abc\u00e9", max_size=30)


@given(
    text=alphabet,
    stops=st.lists(st.text(alphabet="abc\u00e9", min_size=1, max_size=4), max_size=4),
    cuts=st.lists(st.integers(min_value=0, max_value=30), max_size=10),
)
def test_any_split_gives_the_reference_cut(text: str, stops: list[str], cuts: list[int]) -> None:
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    out, stopped = run(pieces, stops)
    expected, expected_stopped = reference_cut(text, stops)
    joined = "".join(out)
    assert joined == expected
    assert stopped == expected_stopped
    assert not any(s in joined for s in stops)
    # Nothing that was sent can be taken back: every prefix of the output is final.
    assert all(expected.startswith("".join(out[:i])) for i in range(len(out)))
