"""The budget of the segment maps (checked batches by ``.log`` key, least recently used
dropped beyond ``max_batches``, each map counted as its batches plus a fixed cost): a walk that
goes on with a map dropped meanwhile does not count its batches, so the count cannot drift above
what the kept maps hold, and maps that never got a batch are bounded too."""

from __future__ import annotations

from sidecar.readserver.service import _MAP_COST, _SegmentMap, _SegmentMaps


def _batch(smap: _SegmentMap) -> None:
    assert smap.add(smap.end, 100, len(smap), len(smap), {0: 1})


def _kept(maps: _SegmentMaps, *keys: str) -> int:
    """What the kept maps among ``keys`` count for."""
    return sum(len(m) + _MAP_COST for k in keys if (m := maps.get(k)) is not None)


def test_a_map_dropped_while_a_walk_holds_it_is_not_counted_again() -> None:
    maps = _SegmentMaps(max_batches=2 * _MAP_COST + 4)
    a = maps.recording("a", 0)
    assert a is not None
    _batch(a)
    maps.added("a", a, 1)
    b = maps.recording("b", 0)
    assert b is not None
    for _ in range(4):
        _batch(b)
    maps.added("b", b, 4)  # over the budget: "a", the least recently used, goes
    assert maps.get("a") is None
    _batch(a)  # the walk of "a" goes on with the map it holds
    maps.added("a", a, 1)
    assert maps._batches == _kept(maps, "a", "b") == 4 + _MAP_COST
    maps.drop("b")  # a chunk its map relies on was fetched again
    _batch(b)
    maps.added("b", b, 1)
    assert maps._batches == 0


def test_a_new_map_under_the_same_key_is_counted_as_itself() -> None:
    maps = _SegmentMaps(max_batches=100 * _MAP_COST)
    old = maps.recording("a", 0)
    assert old is not None
    _batch(old)
    maps.added("a", old, 1)
    maps.drop("a")
    new = maps.recording("a", 0)
    assert new is not None
    _batch(new)
    maps.added("a", new, 1)
    _batch(old)
    maps.added("a", old, 1)  # the old walk's batch: not the kept map's
    assert maps._batches == _kept(maps, "a") == 1 + _MAP_COST


def test_maps_without_batches_count_against_the_budget() -> None:
    """Walks from byte 0 that found no cached chunk leave empty maps: they are dropped like
    any other once their fixed cost fills the budget, the newest kept."""
    maps = _SegmentMaps(max_batches=10 * _MAP_COST)
    for n in range(1000):
        assert maps.recording(f"s{n}", 0) is not None
    assert len(maps._maps) == 10
    assert maps.get("s999") is not None
    assert maps.get("s0") is None
    assert maps._batches == _kept(maps, *(f"s{n}" for n in range(1000))) == 10 * _MAP_COST
