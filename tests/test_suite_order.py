"""The order tests/conftest.py gives the collected tests, which `make test` hands to its workers
module by module: the modules of tests that start long processes first, `slow` or not."""

from __future__ import annotations

import random
from pathlib import Path

from tests.conftest import slow_modules_first


class Item:
    """What slow_modules_first reads of a collected test: its module's path and its markers."""

    def __init__(self, module: str, name: str, markers: tuple[str, ...] = ()) -> None:
        self.path = Path("/tests") / module
        self.name = name
        self.markers = markers

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None

    def __repr__(self) -> str:
        return f"{self.path.name}::{self.name}{list(self.markers)}"


def test_modules_of_long_process_tests_go_first_even_when_they_stay_in_the_fast_set():
    items = [Item("test_pure.py", "a"), Item("test_pure.py", "b"),
             Item("test_dag.py", "pure"), Item("test_dag.py", "dags_test", ("long_process",)),
             Item("test_writers.py", "racing", ("slow",))]
    slow_modules_first(items)
    assert [(item.path.name, item.name) for item in items] == [
        ("test_dag.py", "pure"), ("test_dag.py", "dags_test"), ("test_writers.py", "racing"),
        ("test_pure.py", "a"), ("test_pure.py", "b")]


def test_modules_are_ordered_by_their_count_of_long_tests_and_each_keeps_its_tests_in_order():
    # A seeded sweep over module layouts: each module's tests stay together and in their order,
    # the counts of slow/long_process tests never rise along the order, ties keep first-seen order.
    rng = random.Random(7)
    for _ in range(300):
        items = []
        for module in range(rng.randint(1, 6)):
            for test in range(rng.randint(1, 5)):
                markers = rng.choice([(), (), ("slow",), ("long_process",), ("slow", "long_process")])
                items.append(Item(f"test_{module}.py", f"t{test}", markers))
        rng.shuffle(items)
        first_seen = list(dict.fromkeys(item.path for item in items))
        per_module = {path: [item for item in items if item.path == path] for path in first_seen}
        slow_modules_first(items)
        order = list(dict.fromkeys(item.path for item in items))
        assert [item for path in order for item in per_module[path]] == items, items
        counts = [sum(1 for item in per_module[path] if item.markers) for path in order]
        assert counts == sorted(counts, reverse=True), items
        for a, b in zip(order, order[1:]):
            if counts[order.index(a)] == counts[order.index(b)]:
                assert first_seen.index(a) < first_seen.index(b), items
