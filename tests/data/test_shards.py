"""Webdataset shards as hostile input: world samples written as shards read back pixel for
pixel and caption for caption; folders, single files and brace patterns listed; every
hostile case (unsafe or link member, missing caption or image, bad caption, decompression
bomb, non-image, oversized member, missing, non-tar, truncated shard, garbage header mid-tar)
counted, skipped and named in one line, the good pairs around it kept, nothing written."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from otviz.boundary.images import decode_image
from otviz.data import shards as S
from otviz.data.datasets import EmptyDatasetError, WorldDataset
from otviz.data.shards import ShardError, index_shards, is_shard_spec, shard_paths
from otviz.world.export import export_shards
from tests.helpers import png_header


def png(side: int = 8, value: int = 7) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((side, side, 3), value, np.uint8)).save(out, format="PNG")
    return out.getvalue()


def member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE) -> tuple:
    return name, data, kind


def tar_bytes(members: list[tuple], end: bool = True) -> bytes:
    """A tar of ``(name, data, type)`` members (a link points at ``data``)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                info.linkname = data.decode()
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    raw = out.getvalue()
    if end:
        return raw
    kept = raw.rstrip(b"\0")  # without the end-of-archive blocks
    return kept + b"\0" * (-len(kept) % 512)


def good(key: str, caption: str = "a red square") -> list[tuple]:
    return [member(f"{key}.png", png()), member(f"{key}.txt", caption.encode())]


def test_world_shards_read_back_pixel_for_pixel(tmp_path: Path) -> None:
    paths = export_shards(tmp_path / "shards", 7, "train", seed=3, per_shard=3)
    assert [p.name for p in paths] == ["000000.tar", "000001.tar", "000002.tar"]
    index = index_shards(str(tmp_path / "shards"))
    world = WorldDataset(7, split="train", seed=3)
    assert len(index) == 7 and index.skips.total == 0
    for i in range(7):
        image, caption = world.item(i)
        assert index.captions[i] == caption
        got = np.asarray(decode_image(index.image_bytes(i)))
        np.testing.assert_array_equal(got, np.asarray(image))
    assert index.where(4) == "000001.tar:000000004.png"
    assert index.summary() == "shards: 3 listed, 7 pairs, nothing skipped"


def test_listing_folder_file_and_brace_pattern(tmp_path: Path) -> None:
    export_shards(tmp_path, 5, per_shard=2)
    (tmp_path / "notes.txt").write_text("not a shard")
    listed = shard_paths(str(tmp_path))
    assert [p.name for p in listed] == ["000000.tar", "000001.tar", "000002.tar"]
    assert shard_paths(str(tmp_path / "000001.tar")) == [tmp_path / "000001.tar"]
    pattern = shard_paths(str(tmp_path / "{000001..000003}.tar"))
    assert [p.name for p in pattern] == ["000001.tar", "000002.tar", "000003.tar"]
    assert [p.name for p in shard_paths(str(tmp_path / "s{8..10}.tar"))] == [
        "s8.tar", "s9.tar", "s10.tar"]
    index = index_shards(str(tmp_path / "{000001..000003}.tar"))
    assert len(index) == 3  # samples 2, 3 and 4
    assert index.skips.counts == {S.MISSING: 1}
    assert "1 missing shard (000003.tar)" in index.summary()
    assert is_shard_spec(str(tmp_path)) and is_shard_spec("x/{0..3}.tar")
    assert not is_shard_spec("world") and not is_shard_spec(str(tmp_path / "notes.txt"))
    with pytest.raises(ShardError, match="counts down"):
        shard_paths("s{5..1}.tar")
    with pytest.raises(ShardError, match="names over 1000000 shards"):
        shard_paths("s{0..99999999999}.tar")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ShardError, match="no .tar shard"):
        shard_paths(str(tmp_path / "empty"))


def test_hostile_members_are_counted_skipped_and_named(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(S, "MAX_IMAGE_BYTES", 4096)
    members = [
        *good("000"),
        member("../evil.txt", b"a caption outside"),
        member("/etc/abs.png", png()),
        member("link.png", b"/etc/passwd", tarfile.SYMTYPE),
        member("hard.png", b"000.png", tarfile.LNKTYPE),
        member("001.png", png()),  # no caption
        member("002.txt", b"a caption with no image"),
        member("003.png", png_header(9_000, 9_000)), member("003.txt", b"a bomb"),
        member("004.png", png()), member("004.txt", b"!!!"),  # no letter or digit
        member("005.png", b"not an image at all"), member("005.txt", b"a fake image"),
        member("006.png", b"\0" * 5000), member("006.txt", b"too large"),
        member("007.png", png()), member("007.txt", b"\xff\xfe bad utf-8"),
        *good("008", "a blue circle"),
        member("008.jpg", png()),  # a second image of the key
        *good("sub/009", "a green cross"),
        member("odd\nname.png", png()),  # no caption, and a newline in its name
    ]
    shard = tmp_path / "000000.tar"
    shard.write_bytes(tar_bytes(members))
    before = sorted(tmp_path.rglob("*"))
    index = index_shards(str(shard))
    assert sorted(tmp_path.rglob("*")) == before  # nothing extracted or written
    assert index.captions == ["a red square", "a blue circle", "a green cross"]
    assert [index.where(i) for i in range(3)] == [
        "000000.tar:000.png", "000000.tar:008.png", "000000.tar:sub/009.png"]
    assert index.skips.counts == {
        S.UNSAFE: 2, S.LINK: 2, S.NO_CAPTION: 2, S.NO_IMAGE: 1, S.BAD_IMAGE: 2,
        S.BAD_CAPTION: 2, S.TOO_LARGE: 1, S.DUPLICATE: 1}
    line = index.summary()
    assert "\n" not in line and line.startswith("shards: 1 listed, 3 pairs; skipped 13: ")
    for shown in ("../evil.txt", "/etc/abs.png", "link.png", "001.png", "002.txt",
                  "003.png: is too large (9000x9000 = 81 MP", "004.txt", "005.png",
                  "006.png", "007.txt: not UTF-8", "008.jpg", "odd?name.png"):
        assert shown in line, shown


def test_damaged_shards_keep_the_pairs_before_the_damage(tmp_path: Path) -> None:
    first = tar_bytes([*good("000"), *good("001")], end=False)
    rest = tar_bytes([*good("002"), *good("003")])
    (tmp_path / "a.tar").write_bytes(first + b"GARBAGE!" * 64 + rest)  # a bad header
    whole = tar_bytes([*good("010"), *good("011"), *good("012")])
    cut = whole.index(b"012.txt") - 300  # before 012.txt's header: the shard breaks off
    (tmp_path / "b.tar").write_bytes(whole[:cut])
    (tmp_path / "c.tar").write_bytes(b"not a tar archive at all" * 50)
    (tmp_path / "d.tar").write_bytes(whole)
    index = index_shards(str(tmp_path))
    assert [index.where(i).replace(".tar", "").split(".")[0] for i in range(len(index))] == [
        "a:000", "a:001", "b:010", "b:011", "d:010", "d:011", "d:012"]
    assert index.skips.counts == {S.GARBAGE: 1, S.UNREADABLE: 2}
    garbage = index.skips.names[S.GARBAGE][0]
    assert garbage == f"a.tar at byte {len(first)}, {512 + len(rest)} bytes unread"
    assert index.skips.names[S.UNREADABLE] == ["b.tar", "c.tar"]


def test_nothing_usable_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "x.tar").write_bytes(tar_bytes([member("001.png", png())]))
    with pytest.raises(EmptyDatasetError, match=r"no usable image-caption pair: shards: 1 "
                       r"listed, 0 pairs; skipped 1: 1 image without caption \(x.tar:001.png\)"):
        index_shards(str(tmp_path / "x.tar"))


def test_epoch_order_walks_shards_forward_in_a_seeded_order(tmp_path: Path) -> None:
    export_shards(tmp_path, 10, per_shard=3)  # shards of 3, 3, 3, 1 pairs
    index = index_shards(str(tmp_path))
    orders = [index.epoch_order(seed, epoch) for seed, epoch in ((0, 0), (0, 1), (0, 0))]
    np.testing.assert_array_equal(orders[0], orders[2])
    assert not np.array_equal(orders[0], orders[1])
    for order in orders:
        assert sorted(order.tolist()) == list(range(10))
        runs = np.split(order, np.flatnonzero(np.diff(index.shard[order]) != 0) + 1)
        assert len(runs) == 4  # each shard once, its pairs consecutive and forward
        assert all(np.all(np.diff(r) == 1) for r in runs)


def test_otviz_world_writes_shards(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from otviz.cli.world import main

    assert main(["--as", "webdataset", "--n", "5", "--per-shard", "2", "--split", "train",
                 "--out", str(tmp_path)]) == 0
    assert "wrote 5 world train samples as 3 webdataset shard(s)" in capsys.readouterr().out
    index = index_shards(str(tmp_path / "{000000..000002}.tar"))
    assert index.captions == [WorldDataset(5, "train").item(i)[1] for i in range(5)]
