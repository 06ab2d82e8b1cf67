"""Transitions, RegulariserData and DataBuffer: validation, growth and reservoir sampling."""

from __future__ import annotations

import math

import pytest
import torch

from rofu.models import DataBuffer, RegulariserData, Transitions
from tests.factories import make_transitions


def _numbered(start: int, n: int, d: int = 3, n_arms: int = 4) -> Transitions:
    """Rows whose reward is their global row number, so kept rows can be identified."""
    index = torch.arange(start, start + n, dtype=torch.float64)
    x = index[:, None] + torch.arange(d, dtype=torch.float64) / 10  # (n, d) also identifies rows
    return Transitions(x, torch.arange(start, start + n) % n_arms, index)


# --- Transitions ----------------------------------------------------------------------------


def test_transitions_accepts_valid_batches():
    batch = make_transitions(10, 3, 4)
    assert len(batch) == 10
    assert (
        len(Transitions(torch.empty(0, 3), torch.empty(0, dtype=torch.int64), torch.empty(0))) == 0
    )


I64 = torch.int64
BAD_TRANSITIONS = [
    # (description, the one field that differs from a valid batch of 4 rows, error)
    ("x 1-d", {"x": torch.zeros(4)}, ValueError),
    ("x int", {"x": torch.zeros(4, 2, dtype=I64)}, TypeError),
    ("x list", {"x": [[0.0, 1.0]] * 4}, TypeError),
    ("x NaN", {"x": torch.tensor([[0.0, 0.0]] * 3 + [[0.0, math.nan]])}, ValueError),
    ("x inf", {"x": torch.tensor([[0.0, 0.0]] * 3 + [[math.inf, 0.0]])}, ValueError),
    ("arms int32", {"arms": torch.zeros(4, dtype=torch.int32)}, TypeError),
    ("arms float", {"arms": torch.zeros(4)}, TypeError),
    ("arms short", {"arms": torch.zeros(3, dtype=I64)}, ValueError),
    ("arms 2-d", {"arms": torch.zeros(4, 1, dtype=I64)}, ValueError),
    ("arms negative", {"arms": torch.tensor([0, -1, 2, 0])}, ValueError),
    ("arms list", {"arms": [0, 1, 0, 1]}, TypeError),
    ("rewards long", {"rewards": torch.zeros(5)}, ValueError),
    ("rewards 2-d", {"rewards": torch.zeros(4, 1)}, ValueError),
    ("rewards int", {"rewards": torch.zeros(4, dtype=I64)}, TypeError),
    ("rewards NaN", {"rewards": torch.tensor([0.0, math.nan, 0.0, 0.0])}, ValueError),
    ("rewards -inf", {"rewards": torch.tensor([-math.inf, 0.0, 0.0, 0.0])}, ValueError),
]


@pytest.mark.parametrize(
    ("case", "change", "error"), BAD_TRANSITIONS, ids=[c[0] for c in BAD_TRANSITIONS]
)
def test_transitions_rejects_bad_fields_naming_them(case, change, error):
    fields = {"x": torch.zeros(4, 2), "arms": torch.zeros(4, dtype=I64), "rewards": torch.zeros(4)}
    Transitions(**fields)  # the base batch is valid
    (name,) = change
    with pytest.raises(error, match=rf"^{name} "):
        Transitions(**(fields | change))


def test_transitions_subset_by_index_and_mask():
    batch = _numbered(0, 6)
    picked = batch.subset(torch.tensor([4, 1]))
    assert picked.rewards.tolist() == [4.0, 1.0]
    assert picked.arms.tolist() == [0, 1]
    torch.testing.assert_close(picked.x, batch.x[[4, 1]])
    masked = batch.subset(batch.arms == 1)
    assert masked.rewards.tolist() == [1.0, 5.0]
    assert len(batch.subset(torch.zeros(6, dtype=torch.bool))) == 0


def test_transitions_concat_stacks_in_order():
    parts = [_numbered(0, 3), _numbered(3, 0), _numbered(3, 5)]
    whole = Transitions.concat(parts)
    assert whole.rewards.tolist() == list(map(float, range(8)))
    assert whole.arms.tolist() == [i % 4 for i in range(8)]
    torch.testing.assert_close(whole.x, _numbered(0, 8).x)


def test_transitions_concat_refuses_no_parts_and_mixed_widths():
    with pytest.raises(ValueError, match="parts"):
        Transitions.concat([])
    with pytest.raises(RuntimeError):
        Transitions.concat([_numbered(0, 2, d=3), _numbered(2, 2, d=4)])


def test_transitions_to_returns_itself_when_nothing_changes():
    batch = make_transitions(5, 3, 2)
    assert batch.to("cpu") is batch
    assert batch.to(torch.device("cpu"), torch.float64) is batch


def test_transitions_to_converts_dtype_and_keeps_values():
    batch = make_transitions(5, 3, 2)
    single = batch.to("cpu", torch.float32)
    assert single is not batch
    assert single.x.dtype == single.rewards.dtype == torch.float32
    assert single.arms.dtype == torch.int64
    assert torch.equal(single.arms, batch.arms)
    torch.testing.assert_close(single.x, batch.x.float())
    torch.testing.assert_close(single.rewards, batch.rewards.float())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_transitions_to_moves_to_cuda_and_back():
    batch = make_transitions(5, 3, 2)
    moved = batch.to("cuda")
    assert moved.x.is_cuda
    assert moved.arms.is_cuda
    assert moved.rewards.is_cuda
    assert moved.to("cuda") is moved
    back = moved.to("cpu")
    assert torch.equal(back.x, batch.x)
    assert torch.equal(back.arms, batch.arms)


# --- RegulariserData ------------------------------------------------------------------------


def test_regulariser_data_accepts_a_sample_standing_for_more_pulls():
    sample = _numbered(0, 4)  # arms 0, 1, 2, 3
    data = RegulariserData(sample, 10, torch.tensor([1, 2, 3, 4]))
    assert data.n_total == 10
    # arms never sampled, and trailing arms never pulled in the sample, are fine
    RegulariserData(_numbered(0, 2), 5, torch.tensor([1, 1, 0, 3]))


BAD_REGULARISER_DATA = [
    # (description, n_total, counts, error, match)
    ("n_total below sample", 3, torch.tensor([1, 1, 1, 0]), ValueError, "n_total"),
    ("n_total not int", 4.0, torch.tensor([1, 1, 1, 1]), TypeError, "n_total"),
    ("counts do not sum", 6, torch.tensor([1, 1, 1, 1]), ValueError, "arm_counts sums to 4"),
    ("negative count", 4, torch.tensor([3, 2, 1, -2]), ValueError, "non-negative"),
    ("counts float", 4, torch.tensor([1.0, 1.0, 1.0, 1.0]), TypeError, "arm_counts"),
    ("counts 2-d", 4, torch.tensor([[1, 1], [1, 1]]), TypeError, "arm_counts"),
    ("counts list", 4, [1, 1, 1, 1], TypeError, "arm_counts"),
    ("sample arm beyond counts", 4, torch.tensor([2, 2]), ValueError, "arm index beyond"),
]


@pytest.mark.parametrize(
    ("case", "n_total", "counts", "error", "match"),
    BAD_REGULARISER_DATA,
    ids=[c[0] for c in BAD_REGULARISER_DATA],
)
def test_regulariser_data_rejects_broken_invariants(case, n_total, counts, error, match):
    with pytest.raises(error, match=match):
        RegulariserData(_numbered(0, 4), n_total, counts)


# --- DataBuffer without a limit -------------------------------------------------------------


def test_data_buffer_grows_across_many_appends_keeping_every_row_in_order():
    buffer = DataBuffer(3, dtype=torch.float64)
    sizes = [1, 0, 7, 64, 3, 130, 1, 1, 250, 17]  # crosses several capacity doublings
    start = 0
    for size in sizes:
        buffer.append(_numbered(start, size))
        start += size
        assert len(buffer) == buffer.n_total == start
    view = buffer.view()
    want = _numbered(0, start)
    assert torch.equal(view.rewards, want.rewards)
    assert torch.equal(view.arms, want.arms)
    assert torch.equal(view.x, want.x)
    assert buffer.arm_counts.tolist() == torch.bincount(want.arms, minlength=4).tolist()


def test_data_buffer_counts_grow_when_a_new_arm_appears():
    buffer = DataBuffer(2)

    def add(*arms: int) -> None:
        n = len(arms)
        buffer.append(
            Transitions(torch.zeros(n, 2), torch.tensor(arms, dtype=torch.int64), torch.zeros(n))
        )

    add(0, 1, 1)
    assert buffer.arm_counts.tolist() == [1, 2]
    add(4)
    assert buffer.arm_counts.tolist() == [1, 2, 0, 0, 1]
    add(2, 2, 0)
    assert buffer.arm_counts.tolist() == [2, 2, 2, 0, 1]
    add()
    assert buffer.arm_counts.tolist() == [2, 2, 2, 0, 1]
    assert buffer.arm_counts.dtype == torch.int64
    assert int(buffer.arm_counts.sum()) == buffer.n_total == 7


def test_data_buffer_converts_rows_to_its_dtype():
    buffer = DataBuffer(3)  # float32 by default
    buffer.append(_numbered(0, 5))  # float64 rows
    assert buffer.view().x.dtype == buffer.view().rewards.dtype == torch.float32
    assert buffer.view().rewards.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_data_buffer_rejects_rows_of_another_width():
    buffer = DataBuffer(3)
    with pytest.raises(ValueError, match="batch.x must have 3 features"):
        buffer.append(_numbered(0, 2, d=4))
    assert len(buffer) == buffer.n_total == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"context_dim": 0}, ValueError, "context_dim"),
        ({"context_dim": 2.5}, TypeError, "context_dim"),
        ({"context_dim": 3, "max_size": 0}, ValueError, "max_size"),
        ({"context_dim": 3, "max_size": 10.0}, TypeError, "max_size"),
        ({"context_dim": 3, "window": 0}, ValueError, "window"),
        ({"context_dim": 3, "window": 20, "max_size": 10}, ValueError, "window"),
    ],
)
def test_data_buffer_rejects_bad_arguments_naming_them(kwargs, error, name):
    with pytest.raises(error, match=name):
        DataBuffer(**kwargs)


def test_data_buffer_regulariser_data_pads_counts():
    buffer = DataBuffer(3)
    buffer.append(_numbered(0, 6, n_arms=2))
    data = buffer.regulariser_data(5)
    assert data.arm_counts.tolist() == [3, 3, 0, 0, 0]
    assert data.n_total == 6
    assert len(data.sample) == 6
    assert buffer.regulariser_data().arm_counts.tolist() == [3, 3]
    assert buffer.regulariser_data(1).arm_counts.tolist() == [3, 3], "never truncated"
    data.arm_counts[0] = 99  # a copy: the buffer's own counts are not shared
    assert buffer.arm_counts.tolist() == [3, 3]


def test_data_buffer_regulariser_data_of_an_empty_buffer():
    data = DataBuffer(3).regulariser_data(2)
    assert len(data.sample) == data.n_total == 0
    assert data.arm_counts.tolist() == [0, 0]


# --- DataBuffer with max_size (reservoir) ---------------------------------------------------


def _reservoir(seed: int, sizes: list[int], max_size: int) -> DataBuffer:
    buffer = DataBuffer(
        3, max_size=max_size, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)
    )
    start = 0
    for size in sizes:
        buffer.append(_numbered(start, size))
        start += size
    return buffer


def test_data_buffer_max_size_keeps_exactly_max_size_rows():
    sizes = [10, 25, 1, 40, 100, 3]
    buffer = _reservoir(0, sizes, max_size=30)
    n = sum(sizes)
    assert len(buffer) == 30
    assert buffer.n_total == n
    assert buffer.arm_counts.tolist() == torch.bincount(torch.arange(n) % 4).tolist()
    view = buffer.view()
    rows = view.rewards.long()
    assert len(set(rows.tolist())) == 30, "rows are distinct"
    assert bool(((rows >= 0) & (rows < n)).all())
    # every kept row is intact: its x and arm belong to the same logged row
    torch.testing.assert_close(view.x, _numbered(0, n).x[rows], rtol=0, atol=0)
    assert torch.equal(view.arms, rows % 4)
    data = buffer.regulariser_data(6)
    assert data.n_total == n
    assert len(data.sample) == 30
    assert data.arm_counts.numel() == 6


def test_data_buffer_max_size_keeps_everything_until_full():
    buffer = _reservoir(0, [5, 7, 8], max_size=20)
    assert buffer.view().rewards.tolist() == list(map(float, range(20)))
    buffer.append(_numbered(20, 1))
    assert len(buffer) == 20
    assert buffer.n_total == 21


def test_data_buffer_reservoir_is_deterministic_for_a_generator_seed():
    sizes = [50, 7, 200]
    first = _reservoir(3, sizes, max_size=40).view()
    again = _reservoir(3, sizes, max_size=40).view()
    other = _reservoir(4, sizes, max_size=40).view()
    assert torch.equal(first.rewards, again.rewards)
    assert torch.equal(first.x, again.x)
    assert not torch.equal(first.rewards, other.rewards)


def test_data_buffer_reservoir_sample_is_approximately_uniform():
    # R independent streams of n rows each into a reservoir of k. Algorithm R keeps each
    # row with probability exactly k / n, so the number of streams keeping a given row is
    # Binomial(R, k / n). Rows are grouped into G bins of n / G rows; a bin's count has mean
    # R k / G and, since rows of one stream are negatively correlated (k kept in total),
    # variance at most (n / G) R (k / n)(1 - k / n). We allow 5 standard deviations per bin
    # (a two-sided chance below 1e-5 per bin for a correct sampler), about 15% of the mean,
    # while a sampler that favours early or late rows (keeping the first k rows, or
    # replacing with probability 2k / i) misses the first or last bins by far more.
    n, k, repeats, bins = 200, 20, 400, 10
    kept = torch.zeros(n)
    for seed in range(repeats):
        rows = _reservoir(seed, [k, 1, 30, 149], max_size=k).view().rewards.long()
        kept[rows] += 1
    assert int(kept.sum()) == repeats * k
    per_bin = kept.view(bins, n // bins).sum(dim=1)
    mean = repeats * k / bins
    std = math.sqrt((n // bins) * repeats * (k / n) * (1 - k / n))
    assert float((per_bin - mean).abs().max()) < 5 * std, per_bin.tolist()
    # and no row is starved or hoarded: Binomial(400, 0.1) has mean 40, std 6
    assert float(kept.min()) > 40 - 5 * 6
    assert float(kept.max()) < 40 + 5 * 6


def test_databuffer_restore_continues_counts_and_reservoir():
    from rofu.models import RegulariserData

    first = DataBuffer(3, max_size=50, generator=torch.Generator().manual_seed(0))
    stream = make_transitions(400, 3, 4, seed=11)
    first.append(stream.subset(torch.arange(200)))
    saved = first.regulariser_data(4)
    restored = DataBuffer.restore(saved, max_size=50, generator=torch.Generator().manual_seed(1))
    assert (len(restored), restored.n_total) == (50, 200)
    assert torch.equal(restored.view().x, saved.sample.x)
    restored.append(stream.subset(torch.arange(200, 400)))
    assert restored.n_total == 400
    assert torch.equal(restored.arm_counts, torch.bincount(stream.arms, minlength=4))
    assert len(restored) == 50
    with pytest.raises(ValueError, match="max_size"):
        DataBuffer.restore(RegulariserData(stream, 400, restored.arm_counts), max_size=10)


# --- DataBuffer with a window ----------------------------------------------------------------


def test_data_buffer_window_keeps_the_last_rows_in_order_and_their_counts():
    buffer = DataBuffer(3, dtype=torch.float64, window=50)
    sizes = [1, 0, 7, 64, 3, 130, 1, 1, 49, 250, 17]  # batches smaller and larger than W
    start = 0
    for size in sizes:
        buffer.append(_numbered(start, size))
        start += size
        held = min(start, 50)
        want = _numbered(start - held, held)
        view = buffer.view()
        assert len(buffer) == buffer.n_total == held
        assert buffer.n_seen == start
        assert torch.equal(view.rewards, want.rewards)
        assert torch.equal(view.x, want.x)
        counts = buffer.regulariser_data(4).arm_counts
        assert counts.tolist() == torch.bincount(want.arms, minlength=4).tolist()
    data = buffer.regulariser_data(6)  # D is the window: its counts sum to its rows
    assert (data.n_total, int(data.arm_counts.sum()), len(data.sample)) == (50, 50, 50)


def test_data_buffer_window_lets_an_arm_count_fall_to_zero():
    buffer = DataBuffer(3, window=4)
    buffer.append(Transitions(torch.zeros(4, 3), torch.tensor([0, 0, 1, 1]), torch.zeros(4)))
    buffer.append(Transitions(torch.ones(4, 3), torch.tensor([2, 2, 2, 1]), torch.ones(4)))
    assert buffer.arm_counts.tolist() == [0, 1, 3]
    assert buffer.view().arms.tolist() == [2, 2, 2, 1]


def test_data_buffer_restore_with_a_window_keeps_the_last_rows():
    full = DataBuffer(3, dtype=torch.float64)
    full.append(_numbered(0, 30))
    restored = DataBuffer.restore(full.regulariser_data(4), window=10)
    assert torch.equal(restored.view().rewards, _numbered(20, 10).rewards)
    assert (restored.n_total, restored.n_seen) == (10, 30)
    assert (
        restored.arm_counts.tolist() == torch.bincount(_numbered(20, 10).arms, minlength=4).tolist()
    )
    restored.append(_numbered(30, 5))
    assert torch.equal(restored.view().rewards, _numbered(25, 10).rewards)


def test_data_buffer_restore_with_a_window_recounts_a_reservoir_sample():
    reservoir = DataBuffer(3, max_size=20, generator=torch.Generator().manual_seed(0))
    reservoir.append(make_transitions(100, 3, 4, seed=2))
    saved = reservoir.regulariser_data(4)
    restored = DataBuffer.restore(saved, max_size=20, window=20)
    assert torch.equal(restored.view().x, saved.sample.x)  # its rows, now all of D
    assert restored.n_total == 20
    assert restored.arm_counts.tolist() == torch.bincount(saved.sample.arms, minlength=4).tolist()
