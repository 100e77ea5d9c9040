"""Straggler nodes from the ranks' gathered compute times (pure)."""

from hpctrain.health.stragglers import StragglerTracker

NODES = ["n1", "n1", "n2", "n2"]


def test_a_node_is_named_after_the_window_of_slow_intervals_in_a_row():
    t = StragglerTracker(factor=1.3, window=3)
    slow, named = t.assess([1.0, 1.1, 1.0, 2.0], NODES)
    assert [(s.node, s.ranks, s.ratio, s.intervals) for s in slow] == [("n2", [3], 1.905, 1)]
    assert named == []
    t.assess([1.0, 1.1, 1.0, 2.0], NODES)
    slow, named = t.assess([1.0, 1.1, 1.0, 2.0], NODES)
    assert [(n.node, n.intervals) for n in named] == [("n2", 3)]
    assert named[0].describe().startswith("n2 (rank 3: 1.91× the median compute time, 2000.0 vs "
                                          "1050.0 ms per step, 3 intervals in a row)")


def test_a_normal_interval_resets_the_count():
    t = StragglerTracker(factor=1.3, window=2)
    t.assess([1.0, 1.0, 1.0, 2.0], NODES)
    t.assess([1.0, 1.0, 1.0, 1.2], NODES)            # 1.2 < 1.3 × 1.0
    _, named = t.assess([1.0, 1.0, 1.0, 2.0], NODES)
    assert named == []
    _, named = t.assess([1.0, 1.0, 1.0, 2.0], NODES)   # slow twice in a row again: named
    assert [(n.node, n.intervals) for n in named] == [("n2", 2)]


def test_an_interval_that_cannot_be_compared_neither_extends_nor_breaks_a_streak():
    """Only one rank timed anything in the second interval: nothing to compare, so n2's count
    stays where it was and two more slow intervals name it (window 3)."""
    t = StragglerTracker(factor=1.3, window=3)
    t.assess([1.0, 1.0, 1.0, 2.0], NODES)
    assert t.assess([0.0, 0.0, 0.0, 2.0], NODES) == ([], [])
    t.assess([1.0, 1.0, 1.0, 2.0], NODES)
    _, named = t.assess([1.0, 1.0, 1.0, 2.0], NODES)
    assert [(n.node, n.intervals) for n in named] == [("n2", 3)]


def test_within_factor_is_not_slow_and_one_rank_cannot_be_compared():
    t = StragglerTracker(factor=1.3, window=1)
    assert t.assess([1.0, 1.25, 1.0, 1.29], NODES) == ([], [])
    assert t.assess([1.0, 1.0, 1.0, 1.3], NODES) == ([], [])        # exactly the factor: not above
    assert t.assess([5.0], ["n1"]) == ([], [])
    slow, _ = t.assess([1.0, 3.0, 1.0, 2.0], NODES)
    assert [s.node for s in slow] == ["n1", "n2"]    # slowest first


def test_a_node_with_two_slow_ranks_is_ranked_by_its_slowest():
    """n4's two ranks are both slow (2.0 and 3.0 × the median), n3 has one at 2.5×: n4 is the
    worse node, reported with both ranks and its slowest rank's time."""
    t = StragglerTracker(factor=1.3, window=1)
    nodes = ["n1", "n1", "n2", "n2", "n3", "n3", "n4", "n4"]
    slow, named = t.assess([1.0, 1.0, 1.0, 1.0, 1.0, 2.5, 2.0, 3.0], nodes)
    assert [(s.node, s.ranks, s.ratio, s.seconds) for s in slow] == [
        ("n4", [6, 7], 3.0, 3.0), ("n3", [5], 2.5, 2.5)]
    assert named == slow
    assert slow[0].describe() == ("n4 (ranks 6, 7: 3.00× the median compute time, 3000.0 vs "
                                  "1000.0 ms per step, 1 interval in a row)")


def test_a_node_slow_past_the_window_stays_named():
    """The window is when a node is first named; while it stays slow it stays named (status and
    metrics keep showing it), with the count of intervals growing."""
    t = StragglerTracker(factor=1.3, window=2)
    named_per_interval = [t.assess([1.0, 1.0, 1.0, 2.0], NODES)[1] for _ in range(4)]
    assert [[(n.node, n.intervals) for n in named] for named in named_per_interval] == [
        [], [("n2", 2)], [("n2", 3)], [("n2", 4)]]
    assert named_per_interval[1][0].describe().endswith("ms per step, 2 intervals in a row)")


def test_two_ranks_on_two_nodes_are_compared():
    """The smallest job a straggler can be found in: one rank on each of two nodes."""
    t = StragglerTracker(factor=1.3, window=1)
    slow, named = t.assess([1.0, 2.0], ["n1", "n2"])
    assert [(s.node, s.ranks) for s in named] == [("n2", [1])]


def test_ranks_that_timed_nothing_are_left_out_of_the_median():
    """A rank that reports no compute time for the interval (0 or nothing) says nothing about
    speed: it must not pull the median down and make the others look slow, and an interval in
    which no rank timed anything names nobody."""
    t = StragglerTracker(factor=1.3, window=1)
    assert t.assess([0.0, 0.0, 1.0, 1.2], NODES) == ([], [])
    assert t.assess([None, 0.0, 0.0, None], NODES) == ([], [])
