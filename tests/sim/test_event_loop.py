"""EventLoop: a deterministic heap ordered by (time, priority, per-loop sequence)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retrybench.sim.loop import EventLoop


def drain(loop: EventLoop) -> list[tuple[float, int, object]]:
    out = []
    while loop:
        out.append(loop.pop())
    return out


def test_orders_by_time_first() -> None:
    loop = EventLoop()
    loop.push(3.0, 0, "c")
    loop.push(1.0, 5, "a")
    loop.push(2.0, 0, "b")
    assert [p for _t, _k, p in drain(loop)] == ["a", "b", "c"]


def test_equal_times_order_by_priority() -> None:
    loop = EventLoop()
    loop.push(1.0, 3, "deadline")
    loop.push(1.0, 0, "engine")
    loop.push(1.0, 1, "abort")
    assert drain(loop) == [(1.0, 0, "engine"), (1.0, 1, "abort"), (1.0, 3, "deadline")]


def test_equal_time_and_priority_pop_in_push_order() -> None:
    loop = EventLoop()
    for i in range(10):
        loop.push(0.5, 2, i)
    assert [p for _t, _k, p in drain(loop)] == list(range(10))


def test_payloads_are_never_compared() -> None:
    class Opaque:  # no ordering defined: a comparison would raise TypeError
        pass

    loop = EventLoop()
    a, b = Opaque(), Opaque()
    loop.push(1.0, 0, a)
    loop.push(1.0, 0, b)
    assert [p for _t, _k, p in drain(loop)] == [a, b]


def test_len_and_peek() -> None:
    loop = EventLoop()
    assert len(loop) == 0
    assert not loop
    loop.push(4.0, 1, None)
    loop.push(2.5, 9, None)
    assert len(loop) == 2
    assert loop.peek_time() == 2.5
    loop.pop()
    assert loop.peek_time() == 4.0
    loop.pop()
    assert len(loop) == 0


def test_pop_on_empty_raises() -> None:
    with pytest.raises(IndexError):
        EventLoop().pop()


def test_sequence_belongs_to_each_loop() -> None:
    first, second = EventLoop(), EventLoop()
    for loop in (first, second):
        loop.push(1.0, 0, "x")
        loop.push(1.0, 0, "y")
    assert drain(first) == drain(second)


def test_events_pushed_while_draining_keep_the_order() -> None:
    loop = EventLoop()
    loop.push(1.0, 1, "a")
    loop.push(2.0, 0, "c")
    seen = []
    while loop:
        t, _k, payload = loop.pop()
        seen.append(payload)
        if payload == "a":
            loop.push(t, 1, "b")  # same time and priority: after everything pushed before
            loop.push(t, 0, "a0")  # same time, lower priority number: first
    assert seen == ["a", "a0", "b", "c"]


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.tuples(st.floats(0, 100, allow_nan=False), st.integers(0, 5)), max_size=60))
def test_pops_are_sorted_by_time_priority_sequence(items: list[tuple[float, int]]) -> None:
    loop = EventLoop()
    for i, (t, k) in enumerate(items):
        loop.push(t, k, i)
    popped = drain(loop)
    expected = sorted(((t, k, i) for i, (t, k) in enumerate(items)))
    assert popped == expected
