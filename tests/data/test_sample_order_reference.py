"""The sample order ``feistel-v1`` is a format: a checkpoint records it, and a resume in any
later version must read exactly the samples the saved run would have read. So the order is
checked against a second implementation written here from its description (``data/order.py``'s
docstring) and against splitmix64's published outputs (Vigna's reference generator seeded with
0), for the corpus sizes a run meets: one sample, a power of four, one past it, odd sizes, and
several epochs, seeds and streams read by one rank in the order an evaluation interleaves them.
"""

from __future__ import annotations

import numpy as np
import pytest

from hpctrain.data.order import FeistelOrder, PermutationOrder, make_order

MASK64 = 2**64 - 1
# splitmix64 seeded with 0: its first three outputs (the reference's test vector)
SPLITMIX64_FROM_0 = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]


def splitmix64_next(state: int) -> tuple[int, int]:
    """Vigna's splitmix64: (new state, output)."""
    state = (state + 0x9E3779B97F4A7C15) % 2**64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return state, z ^ (z >> 31)


def reference_order(n: int, seed: int, epoch: int, stream: tuple) -> list[int]:
    """feistel-v1 as described: a balanced Feistel network on the smallest even number of bits
    2h (h >= 1) with 4^h >= n, six rounds whose function is splitmix64 of (right half XOR round
    key) keeping h bits, round keys from SeedSequence((seed, epoch, *stream)), and cycle
    walking into [0, n)."""
    h = 1
    while 4**h < n:
        h += 1
    keys = [int(k) for k in np.random.SeedSequence([seed, epoch, *stream]).generate_state(
        6, np.uint64)]

    def network(x: int) -> int:
        left, right = divmod(x, 2**h)
        for k in keys:
            left, right = right, left ^ (splitmix64_next(right ^ k)[1] % 2**h)
        return left * 2**h + right

    out = []
    for position in range(n):
        x = network(position)
        while x >= n:
            x = network(x)
        out.append(x)
    return out


def test_the_reference_splitmix64_is_the_published_one():
    state, outputs = 0, []
    for _ in range(3):
        state, z = splitmix64_next(state)
        outputs.append(z)
    assert outputs == SPLITMIX64_FROM_0


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 16, 17, 63, 64, 65, 1000])
def test_the_order_is_feistel_v1_for_every_corpus_size(n):
    order = FeistelOrder(n, seed=1234, stream=(0, 1))
    for epoch in (0, 1, 7):
        assert [order.index(epoch, p) for p in range(n)] == \
            reference_order(n, 1234, epoch, (0, 1)), (n, epoch)


def test_one_rank_reading_epochs_and_splits_interleaved_reads_each_one_s_order():
    # training reads epoch 3 of the train split, an evaluation reads the validation split's
    # epoch 0, training goes on in epoch 3, then enters epoch 4: each read is the order's own
    n = 300
    train, valid = FeistelOrder(n, 42, (0, 0)), FeistelOrder(n, 42, (1, 0))
    reads = [(train, 3, (0, 0)), (valid, 0, (1, 0)), (train, 3, (0, 0)), (train, 4, (0, 0)),
             (train, 3, (0, 0)), (valid, 0, (1, 0))]
    for order, epoch, stream in reads:
        expected = reference_order(n, 42, epoch, stream)
        for p in (0, 1, n // 2, n - 1):
            assert order.index(epoch, p) == expected[p], (epoch, stream, p)


def test_runs_saved_with_the_former_order_read_numpy_s_permutation_of_every_epoch():
    order = make_order("permutation", 50, 7, (0, 1))
    for epoch in (0, 1, 0, 2):      # a resume into an earlier epoch's evaluation, then on
        former = np.random.Generator(np.random.PCG64([7, epoch, 0, 1])).permutation(50)
        assert [order.index(epoch, p) for p in range(50)] == list(former)
    assert isinstance(order, PermutationOrder) and order.kind == "permutation"
    assert make_order("feistel-v1", 50, 7, (0, 1)).kind == "feistel-v1"


def test_an_unknown_order_in_a_checkpoint_and_an_empty_corpus_are_refused():
    with pytest.raises(ValueError, match=r"unknown sample order 'feistel-v2' \(known: "
                                         r"feistel-v1, permutation\)"):
        make_order("feistel-v2", 10, 0)
    with pytest.raises(ValueError, match="at least one sample"):
        FeistelOrder(0, 0)
