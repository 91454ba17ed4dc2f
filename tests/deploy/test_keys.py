"""The gateway's key ring over real key files: a file that appears or goes is seen on the next
lookup, a rewritten one within KEY_RECHECK_S, and a file that cannot be a key (too short, not a
tenant id, the admin key, another tenant's key) is never accepted. The live gateway path is
tests/deploy/test_tenant_live.py."""

from __future__ import annotations

import os
import stat

from pipelines.deploy.keys import KeyRing, delete_key_file, key_folder, key_path, write_key_file

ADMIN = "admin-key-0123456789abc"


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_added_deleted_and_rewritten_key_files_are_followed(tmp_path):
    clock = Clock()
    ring = KeyRing({"conf": "configured-key-0123456789"}, key_folder(tmp_path), reserved=(ADMIN,), clock=clock)
    assert ring.tenants() == ["conf"]
    key, created = write_key_file(key_path(tmp_path, "newco"))
    assert created and len(key) == 48 and stat.S_IMODE(key_path(tmp_path, "newco").stat().st_mode) == 0o600
    assert write_key_file(key_path(tmp_path, "newco")) == (key, False)  # never replaced
    assert ring.tenant_of(key) == "newco"  # no clock advance: the folder's change alone
    assert delete_key_file(key_path(tmp_path, "newco")) and ring.tenant_of(key) is None

    other, _ = write_key_file(key_path(tmp_path, "other"))
    assert ring.tenant_of(other) == "other"
    rotated = "rotated-key-for-other-0123456789"
    path = key_path(tmp_path, "other")
    st = os.stat(path.parent)
    path.write_text(rotated)  # in place: the folder's mtime does not change
    os.utime(path.parent, ns=(st.st_atime_ns, st.st_mtime_ns))
    clock.t += 0.5
    assert ring.tenant_of(other) == "other"  # not yet re-read...
    clock.t += 0.6
    assert ring.tenant_of(other) is None and ring.tenant_of(rotated) == "other"  # ...within KEY_RECHECK_S


def test_files_that_cannot_be_keys_are_skipped_with_a_reason(tmp_path):
    folder = key_folder(tmp_path)
    folder.mkdir(parents=True)
    (folder / "short.key").write_text("abc")
    (folder / "empty.key").write_text("")
    (folder / "_hidden.key").write_text("a-perfectly-long-key-0123456789")
    (folder / "sneaky.key").write_text(ADMIN)
    (folder / "copy1.key").write_text("shared-key-0123456789abcdef")
    (folder / "copy2.key").write_text("shared-key-0123456789abcdef")
    (folder / "conf.key").write_text("file-key-for-conf-0123456789")
    (folder / "thief.key").write_text("configured-key-0123456789")
    ring = KeyRing({"conf": "configured-key-0123456789"}, folder, reserved=(ADMIN,))
    for token in ("", "abc", ADMIN, "a-perfectly-long-key-0123456789", "shared-key-0123456789abcdef",
                  "file-key-for-conf-0123456789"):
        assert ring.tenant_of(token) is None, token
    assert ring.tenant_of("configured-key-0123456789") == "conf"  # configuration wins over files
    assert ring.tenants() == ["conf"]
    assert set(ring.skipped) == {"short.key", "empty.key", "_hidden.key", "sneaky.key", "copy1.key", "copy2.key",
                                 "thief.key"}
    assert "fewer than 16" in ring.skipped["short.key"] and "admin key" in ring.skipped["sneaky.key"]
    assert "the same key as tenant(s) ['copy2']" == ring.skipped["copy1.key"]
