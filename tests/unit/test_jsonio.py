"""The shared file helpers of common/: "a JSON object or {}" (read_json_object and its
parser), the atomic writes (JSON's options, links, a failure), and a file's sha256."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from train.common.filehash import file_sha256
from train.common.jsonio import parse_json_object, read_json_object, write_json_atomic
from train.common.safewrite import write_atomic


@pytest.mark.parametrize("text", ["[1, 2]", "3", "null", "{", "\"x\"", "[" * 100000,
                                  "\udcff"])
def test_anything_but_a_json_object_reads_as_empty(tmp_path: Path, text: str) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    assert read_json_object(path, 1 << 20) == {}
    assert read_json_object(path, None) == {}


def test_a_missing_file_a_folder_and_a_fifo_read_as_empty(tmp_path: Path) -> None:
    assert read_json_object(tmp_path / "none.json", 100) == {}
    assert read_json_object(tmp_path, 100) == {}
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert read_json_object(fifo, None) == {}  # at once: nothing writes to it


def test_the_limit_is_the_largest_size_read(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text('{"a": 1}')
    assert read_json_object(path, 8) == {"a": 1}
    assert read_json_object(path, 7) == {}
    assert read_json_object(path, None) == {"a": 1}


def test_parse_constant_reads_nan_as_asked() -> None:
    raw = b'{"a": NaN, "b": Infinity}'
    assert parse_json_object(raw, parse_constant=lambda _name: None) == {"a": None, "b": None}
    assert str(parse_json_object(raw)["a"]) == "nan"


def test_the_writer_keeps_order_and_indent_as_asked(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "x.json"
    write_json_atomic(path, {"b": 1, "a": [1]}, indent=None, sort_keys=False, fsync=False)
    assert path.read_text() == '{"b": 1, "a": [1]}\n'
    write_json_atomic(path, {"b": 1, "a": 2})
    assert path.read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'
    assert json.loads(path.read_text()) == read_json_object(path, None)
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]


def test_file_sha256_is_the_digest_of_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    data = os.urandom(3 << 20 | 17)  # several blocks and a partial one
    path.write_bytes(data)
    assert file_sha256(path) == hashlib.sha256(data).hexdigest()
    assert file_sha256(str(path)) == file_sha256(path)
    with pytest.raises(OSError):
        file_sha256(tmp_path / "none")


def test_an_atomic_write_replaces_a_link_and_a_failed_one_leaves_all_as_it_was(
        tmp_path: Path) -> None:
    outside = tmp_path / "theirs.json"
    outside.write_text("{}\n")
    target = tmp_path / "run" / "status.json"
    target.parent.mkdir()
    target.symlink_to(outside)
    write_json_atomic(target, {"a": 1})
    assert outside.read_text() == "{}\n" and not target.is_symlink()
    assert json.loads(target.read_text()) == {"a": 1}

    def refuse(tmp: Path) -> None:
        raise OSError("no")

    with pytest.raises(OSError):
        write_atomic(target, "other", before=refuse)
    assert json.loads(target.read_text()) == {"a": 1}
    assert sorted(p.name for p in target.parent.iterdir()) == ["status.json"]


def test_a_read_that_returns_less_is_read_on_to_the_end(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # a FUSE mount in direct-I/O mode (and any read over 2 GiB) may return fewer bytes than
    # asked: the object is read whole, never taken for cut ({}) or over the limit
    path = tmp_path / "status.json"
    value = {"seeds": {str(i): {"episodes": i} for i in range(200)}}
    path.write_text(json.dumps(value))
    read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: read(fd, min(n, 7)))
    assert read_json_object(path, None) == value
    assert read_json_object(path, 1 << 20) == value
    assert read_json_object(path, 100) == {}  # over the limit still
