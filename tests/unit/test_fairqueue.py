"""The waiting line: round-robin by client, arrival order within a client (or overall when off)."""

from __future__ import annotations

from kinetic.scheduling.fairqueue import FairQueue


def drain(queue: FairQueue[str]) -> list[str]:
    order = []
    while queue:
        client, item = next(queue.in_order())
        queue.served(client, item)
        order.append(item)
    return order


def test_a_late_client_is_served_before_an_early_clients_backlog() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.served("A", "a0")  # A's first request already got the slot
    for i in range(1, 10):
        queue.push("A", f"a{i}")
    queue.push("B", "b1")
    assert drain(queue)[:2] == ["b1", "a1"]


def test_clients_take_turns_and_keep_their_own_order() -> None:
    queue: FairQueue[str] = FairQueue()
    for item in ("a1", "a2", "a3", "b1", "b2", "c1"):
        queue.push(item[0].upper(), item)
    assert drain(queue) == ["a1", "b1", "c1", "a2", "b2", "a3"]


def test_without_fairness_it_is_arrival_order() -> None:
    queue: FairQueue[str] = FairQueue(fair=False)
    for item in ("a1", "a2", "b1"):
        queue.push(item[0].upper(), item)
    assert drain(queue) == ["a1", "a2", "b1"]


def test_remove_and_counts() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.push("A", "a1")
    queue.push("A", "a2")
    queue.push("B", "b1")
    assert queue.counts() == {"A": 2, "B": 1} and len(queue) == 3
    assert queue.remove("a1") and not queue.remove("zz")
    assert queue.remove("b1") and queue.counts() == {"A": 1}


def test_an_item_given_back_goes_first_of_all() -> None:
    for fair in (True, False):
        queue: FairQueue[str] = FairQueue(fair=fair)
        for item in ("a1", "b1", "c1", "c2"):
            queue.push(item[0].upper(), item)
        client, item = next(queue.in_order())
        queue.served(client, item)
        assert item == "a1"
        queue.push("A", "a2")
        queue.served("B", "b1")  # b1 started too, and C waited longest
        queue.give_back("A", "a1")  # a1 found no room to be read: it waits again, before everyone
        assert drain(queue) == (["a1", "c1", "a2", "c2"] if fair else ["a1", "c1", "c2", "a2"])
