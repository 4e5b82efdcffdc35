"""``TrainBatches`` (multigpu/data/train_batches.py) without processes: a loader's state kept after each batch it
yields, not after those Lightning drew ahead, and counted from the batch a resume starts at; the samples of a
collated batch. Its even end across ranks is proven under ddp in tests/data/test_libraries.py and
test_hugging_face.py."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from multigpu.data.train_batches import TrainBatches, drawn_ahead, samples_in
from tests.data.test_hugging_face import Counting


class CountingLoader:
    """Batches of ``Counting``'s numbers, with its state and no length (as a ``StatefulDataLoader`` over a stream)."""

    def __init__(self, size: int, batch_size: int) -> None:
        self.stream, self.batch_size = Counting(size), batch_size

    def __iter__(self):
        return iter(DataLoader(self.stream, batch_size=self.batch_size))

    def state_dict(self) -> dict[str, int]:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.stream.load_state_dict(state)


def test_train_batches_keep_a_loader_state_after_each_batch_not_after_those_drawn_ahead():
    loader = CountingLoader(10, batch_size=4)
    batches = iter(TrainBatches(loader))
    next(batches), next(batches)  # Lightning draws the second batch before it trains the first
    assert batches.state_after(loader, 1) == {"yielded": 4} and loader.state_dict() == {"yielded": 8}
    resumed = TrainBatches(CountingLoader(10, batch_size=4))
    [restored] = resumed.positioned()
    restored.load_state_dict(batches.state_after(loader, 1))
    resumed.start_at(1)
    assert [batch.tolist() for batch, _, _ in resumed] == [[4, 5, 6, 7], [8, 9]]
    assert resumed.state_after(restored, 3) == {"yielded": 10}  # counted from the batch it resumed at


def test_only_a_loader_with_a_state_and_no_length_is_drawn_ahead():
    assert drawn_ahead(CountingLoader(10, batch_size=4))
    assert not drawn_ahead(DataLoader(range(10), batch_size=4))  # no state of its own
    assert not drawn_ahead([1, 2])


def test_the_samples_of_a_batch_are_its_first_tensors_first_dimension():
    assert samples_in({"id": torch.arange(3), "x": torch.zeros(3, 4)}) == 3
    assert samples_in([torch.zeros(2, 5), torch.zeros(2)]) == 2
    assert samples_in(torch.tensor(1.0)) == 1
