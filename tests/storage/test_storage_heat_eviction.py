"""Disk eviction by shared heat: the index keeps each entry's heat, so processes on one folder agree."""

import sqlite3
import time

from storage_testutil import key_for, make_entry

from fusionrag_llm.storage import DiskTier
from fusionrag_llm.storage.heat import bump_heat_time, heat_at

TOKENS = 256  # 2 layers x 2 heads x 256 tokens x 8 dims x 4 B x (K, V): 64 KiB, a file each


def heat_times(folder) -> dict[str, float]:
    with sqlite3.connect(folder / "cache.db") as sql:
        return dict(sql.execute("SELECT key, heat FROM entries"))


def test_hot_entries_survive_and_cold_go_first_across_two_store_objects(tmp_path):
    folder = tmp_path / "s"
    writer = DiskTier(folder, 2**30, min_file_bytes=1024)
    for seed in range(4):
        assert writer.put(key_for(seed, TOKENS), make_entry(seed, TOKENS))
    room_for_four = writer.used_bytes + 32 * 1024  # 4 entries and the db, not a fifth entry
    writer.close()
    first = DiskTier(folder, room_for_four, min_file_bytes=1024)
    second = DiskTier(folder, room_for_four, min_file_bytes=1024)
    for _ in range(3):  # entry 0 is hot, read through the second object (another process)
        assert second.get(key_for(0, TOKENS)) is not None
    for seed in (1, 2, 3):  # read once each, and later than entry 0: LRU would evict entry 0 first
        assert first.get(key_for(seed, TOKENS)) is not None

    assert first.put(key_for(4, TOKENS), make_entry(4, TOKENS))
    assert first.evictions == 1
    assert key_for(0, TOKENS) in first and key_for(1, TOKENS) not in first  # the oldest of the heat-2 entries
    assert first.put(key_for(5, TOKENS), make_entry(5, TOKENS))  # entry 4 (heat 1) is now the coldest
    assert key_for(4, TOKENS) not in second and key_for(0, TOKENS) in second
    assert {key_for(s, TOKENS) for s in (0, 2, 3, 5)} == set(second.keys())
    first.close()
    second.close()


def test_reads_from_two_objects_add_up_in_the_index(tmp_path):
    first = DiskTier(tmp_path / "s", 2**30)
    second = DiskTier(tmp_path / "s", 2**30, heat_half_life_s=3600.0)
    key = key_for(1)
    first.put(key, make_entry(1))
    for tier in (first, second, first, second):
        assert tier.get(key) is not None
    heat_time = heat_times(tmp_path / "s")[key]
    assert 4.9 < heat_at(heat_time, time.time(), 3600.0) <= 5.0  # 1 write + 4 reads, barely decayed
    first.close()
    second.close()


def test_a_forged_heat_is_reset_not_trusted(tmp_path):
    tier = DiskTier(tmp_path / "s", 2**30)
    key = key_for(2)
    tier.put(key, make_entry(2))
    with sqlite3.connect(tmp_path / "s" / "cache.db") as sql:
        sql.execute("UPDATE entries SET heat = 'hot' WHERE key = ?", (key,))
    assert tier.get(key) is not None
    assert isinstance(heat_times(tmp_path / "s")[key], float)
    tier.close()


def test_heat_time_orders_like_decayed_access_counts():
    half_life = 10.0
    many_old = None
    for t in (0.0, 1.0, 2.0, 3.0):  # four reads long ago
        many_old = bump_heat_time(many_old, t, half_life)
    one_new = bump_heat_time(None, 15.0, half_life)
    assert heat_at(many_old, 15.0, half_life) > heat_at(one_new, 15.0, half_life)  # 4 * 2^-1.3 > 1
    assert heat_at(many_old, 40.0, half_life) < heat_at(bump_heat_time(None, 35.0, half_life), 40.0, half_life)
