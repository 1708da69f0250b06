"""bench.model's synthetic decode batches fit the blocks each sequence owns."""

import pytest

from bench.model import BLOCK, DECODE_STEPS, FIRST_BLOCK, SEQ_BLOCKS, decode_batch


@pytest.mark.parametrize("rows", [1, 64])
def test_every_decode_step_fits_its_sequences_blocks(rows: int) -> None:
    for step in (0, DECODE_STEPS - 1):
        batch = decode_batch(rows, step, FIRST_BLOCK)
        assert batch.num_seqs == rows
        # each token's slot lies in its own sequence's blocks
        for t in range(rows):
            table = batch.block_tables[batch.seq_of_token[t]]
            assert batch.slot_mapping[t] // BLOCK in table.tolist()
            assert int(batch.positions[t]) < SEQ_BLOCKS * BLOCK


def test_a_step_past_the_blocks_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="at most 64 steps"):
        decode_batch(64, DECODE_STEPS, FIRST_BLOCK)
