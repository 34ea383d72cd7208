"""Kept results' keys and checkpoint files, without a cluster (kernel/keep.py)."""

from __future__ import annotations

import numpy as np
import pytest

from gpucell.core.resume import CellKey, Kept
from gpucell.kernel import keep


def _key(**kw):
    base = dict(cell="c", inputs=(("a", "1"), ("b", "2")), items="i", count=5)
    base.update(kw)
    return CellKey(**base)


def test_differences_name_what_changed():
    k = _key()
    assert k.differences(_key()) == []
    assert _key(inputs=(("a", "1"), ("b", "3"))).differences(k) == ["`b` changed"]
    assert _key(cell="d").differences(k) == ["the cell's code changed"]
    assert _key(count=6).differences(k) == ["the loop now has 6 iterations, not 5"]
    assert _key(inputs=(("a", None), ("b", "2"))).differences(k) == [
        "`a` cannot be compared (no content digest)"
    ]
    assert "the loop now reads `c`" in _key(
        inputs=(("a", "1"), ("b", "2"), ("c", "0"))
    ).differences(k)
    assert CellKey.from_json(k.as_json()) == k


def test_content_digests_follow_content_not_identity():
    a = np.arange(10.0)
    assert keep.content_digest(a) == keep.content_digest(a.copy())
    b = a.copy()
    b[3] = -1
    assert keep.content_digest(a) != keep.content_digest(b)
    assert keep.content_digest({"x": [1, 2]}) == keep.content_digest({"x": [1, 2]})
    assert keep.content_digest(lambda: open) is not None


def test_checkpoint_files_round_trip_and_damage_is_reported(tmp_path):
    ck = keep.Checkpoint(tmp_path / "c", "cell text")
    ck.open(_key())
    ck.write(0, 2, {"v": np.arange(3)})
    ck.write(2, 5, {"v": [1]})
    assert ck.drain() == []  # written by a thread of its own
    kept, notes = ck.load()
    assert notes == [] and kept is not None and kept.ranges() == [(0, 2), (2, 5)]
    assert np.array_equal(kept.done[0][1]["v"], np.arange(3))
    victim = next(ck.folder.glob("chunk-*0002-*.bin"))
    victim.write_bytes(victim.read_bytes()[:-3])
    kept, notes = ck.load()
    assert kept.ranges() == [(0, 2)] and "is damaged" in notes[0]
    assert not list(ck.folder.glob(".tmp-*"))  # no temporary file left
    ck.remove()
    assert not (tmp_path / "c").exists()


def test_a_new_key_drops_chunks_of_the_old_one(tmp_path):
    ck = keep.Checkpoint(tmp_path, "cell")
    ck.open(_key())
    ck.write(0, 1, 1)
    ck.drain()
    ck.open(_key(items="other"))
    kept, _ = ck.load()
    assert kept.done == {}


def test_memory_keeps_a_bounded_number_of_cells():
    from gpucell.kernel.session import using

    with using() as session:  # the kernel's own kept cells stay as they are
        for i in range(keep.MAX_KEPT_CELLS + 2):
            keep.remember(f"cell {i}", Kept(None))
        assert len(session.kept) == keep.MAX_KEPT_CELLS
        assert keep.kept_for("cell 0") is None
        assert keep.latest_kept() is keep.kept_for(f"cell {keep.MAX_KEPT_CELLS + 1}")


@pytest.mark.parametrize("n", [0, 1])
def test_kept_merges_in_iteration_order(n):
    k = Kept(None)
    k.add(4, 6, "b")
    k.add(0, 4, "a")
    assert [r for _a, r in k.results()] == ["a", "b"]
    assert k.missing(8 + n) == [(6, 8 + n)]
