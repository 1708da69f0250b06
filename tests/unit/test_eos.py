"""End of generation: a model's end-of-turn ids, and the stop ids of one request."""

from __future__ import annotations

import pytest

from shared.eos import end_of_generation_ids, stop_token_ids


def test_named_ids_plus_the_specials_that_end_a_turn() -> None:
    specials = {1: "<|im_start|>", 2: "<|im_end|>", 7: "<|eot_id|>", 9: "<|endoftext|>"}
    assert end_of_generation_ids({9, 4}, specials) == [2, 4, 7, 9]
    assert end_of_generation_ids([], {3: "<s>"}) == []


@pytest.mark.parametrize(
    ("eos", "own", "ignore_eos", "expected"),
    [
        ([2], [9, 2], False, (2, 9)),  # EOS first, then the request's own, each EOS once
        ([2, 0], [], False, (2, 0)),
        ([2], [9, 2], True, (9, 2)),  # ignore_eos: only the request's own
        ([2], [], True, ()),
    ],
)
def test_stop_ids_of_a_request(
    eos: list[int], own: list[int], ignore_eos: bool, expected: tuple[int, ...]
) -> None:
    assert stop_token_ids(eos, own, ignore_eos) == expected
