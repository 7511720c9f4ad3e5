"""The staged-file store on its own: content-hash ids, per-user lookups, expiry and the
byte accounting that the gateway's limits rely on (a fake clock: no waiting)."""

from __future__ import annotations

import pytest

from pathmaster.image.io import ImageHeader
from services.gateway.staging import StagedFiles, StagingFull, StagingLimits, content_id

HEADER = ImageHeader(10, 10, "PNG", "RGB")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_ids_are_per_user_and_the_same_bytes_are_held_once():
    store = StagedFiles(StagingLimits(ttl_s=60), clock=Clock())
    file_id = store.put("ann", b"x" * 100, HEADER, "image")
    assert file_id == content_id(b"x" * 100)
    assert store.put("ann", b"x" * 100, HEADER, "background") == file_id  # shared background
    assert store.usage("ann") == (1, 100) and store.total_bytes == 100
    found, missing = store.take("ann", [("c1-background.png", file_id), ("c2-background.png", file_id)])
    assert set(found) == {"c1-background.png", "c2-background.png"} and missing == []
    assert store.known("ann", file_id, "mask") is None  # not checked as a mask
    assert store.take("bob", [("c1.png", file_id)]) == ({}, ["c1.png"])


def test_expired_files_are_dropped_and_their_bytes_released_and_use_renews_them():
    clock = Clock()
    store = StagedFiles(StagingLimits(ttl_s=60), clock=clock)
    kept = store.put("ann", b"a" * 10, HEADER, "image")
    store.put("ann", b"b" * 20, HEADER, "image")
    clock.now += 50
    assert store.take("ann", [("a.png", kept)])[1] == []  # renewed for another 60 s
    clock.now += 30
    assert store.purge() == 1
    assert store.usage("ann") == (1, 10) and store.total_bytes == 10
    clock.now += 61
    assert store.purge() == 1 and store.total_bytes == 0


def test_limits_are_checked_before_a_file_is_held():
    store = StagedFiles(StagingLimits(user_files=2, user_bytes=100, total_bytes=150), clock=Clock())
    store.put("ann", b"a" * 60, HEADER, "image")
    with pytest.raises(StagingFull) as full:
        store.put("ann", b"b" * 60, HEADER, "image")
    assert full.value.per_user
    store.put("bob", b"c" * 80, HEADER, "image")
    with pytest.raises(StagingFull) as full:
        store.check_room("cy", 20)
    assert not full.value.per_user
    assert store.discard("ann") == 1 and store.total_bytes == 80
