"""The training loaders' position a checkpoint holds (multigpu/data/position.py): where the next pass starts, and the
entry of a checkpoint written before ``GlobalBatchDataModule`` returned plain loaders, read as today's."""

from multigpu.data.position import Position, read_position

COUNTS = {"epoch": 1, "batches_done": 3, "epoch_length": 16}


def test_the_next_pass_starts_past_what_was_trained_or_at_the_next_epoch():
    assert Position(1, 3, 16).start() == (1, 3)
    assert Position(1, 16, 16).start() == (2, 0)


def test_an_entry_reads_back_as_it_was_saved():
    states = {"world_size": 2, "ranks": [[{"a": 1}], [{"a": 2}]]}
    position = Position(1, 3, 16, states)
    assert read_position(position.entry()) == position
    assert read_position(COUNTS) == Position(1, 3, 16)
    assert read_position({}) is None


def test_a_global_batch_data_modules_former_loader_state_is_left_to_the_position():
    """Its loader saved the position itself, for every rank; another loader's state beside it is kept."""
    old = {**COUNTS, "loaders": {"world_size": 2, "ranks": [[COUNTS], [COUNTS]]}}
    assert read_position(old) == Position(1, 3, 16)
    beside = {**COUNTS, "loaders": {"world_size": 2, "ranks": [[COUNTS, {"a": 1}], [COUNTS, {"a": 2}]]}}
    assert read_position(beside).states == {"world_size": 2, "ranks": [[{"a": 1}], [{"a": 2}]]}
