"""The reloading serving certificate: rotation, a half-written pair, bad files at start-up."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hami_common.errors import InvalidInput
from hami_webhook.tls import ReloadingCertificate
from tests.webhook.support import write_self_signed


def bump(path: Path) -> None:
    """Make a rewrite visible even where the file system's clock is coarse."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_unchanged_files_are_not_reloaded(tmp_path: Path) -> None:
    write_self_signed(tmp_path / "c", tmp_path / "k")
    cert = ReloadingCertificate(tmp_path / "c", tmp_path / "k")
    assert cert.check() is False
    assert cert.reloads == 0


def test_a_new_pair_is_loaded(tmp_path: Path) -> None:
    write_self_signed(tmp_path / "c", tmp_path / "k")
    cert = ReloadingCertificate(tmp_path / "c", tmp_path / "k")
    write_self_signed(tmp_path / "c", tmp_path / "k")
    bump(tmp_path / "c")
    assert cert.check() is True
    assert cert.reloads == 1


def test_a_half_written_pair_keeps_the_old_one_until_the_key_arrives(tmp_path: Path) -> None:
    write_self_signed(tmp_path / "c", tmp_path / "k")
    cert = ReloadingCertificate(tmp_path / "c", tmp_path / "k")
    write_self_signed(tmp_path / "c", tmp_path / "next.key")  # the certificate is new, the key not yet
    bump(tmp_path / "c")
    assert cert.check() is False
    (tmp_path / "next.key").replace(tmp_path / "k")
    bump(tmp_path / "k")
    assert cert.check() is True


def test_key_and_certificate_in_one_file(tmp_path: Path) -> None:
    write_self_signed(tmp_path / "c", tmp_path / "k")
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes((tmp_path / "k").read_bytes() + (tmp_path / "c").read_bytes())
    assert ReloadingCertificate(bundle).check() is False


@pytest.mark.parametrize("broken", ["missing", "garbage"])
def test_bad_files_at_start_up_are_invalid_input(tmp_path: Path, broken: str) -> None:
    write_self_signed(tmp_path / "c", tmp_path / "k")
    if broken == "missing":
        (tmp_path / "k").unlink()
    else:
        (tmp_path / "k").write_text("not a key")
    with pytest.raises(InvalidInput, match="cannot load the serving certificate"):
        ReloadingCertificate(tmp_path / "c", tmp_path / "k")
