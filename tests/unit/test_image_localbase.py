"""`train image build --engine apptainer --base-sif SIF`: the local SIF checked before any
engine starts, the definition rewritten onto it (header only), the build arguments it no
longer uses left out (Apptainer refuses an unused one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from train.common.errors import UsageError
from train.images import build as localbase
from train.images.defs import parse

BASE_DEF = REPO / "containers" / "base.def"


def _sif(path: Path) -> Path:
    path.write_bytes(b"#!/usr/bin/env run-singularity\n\x00" + b"SIF_MAGIC" + b"\x00" * 100)
    return path


@pytest.mark.parametrize(("make", "said"), [
    (lambda p: p / "missing.sif", "does not exist"),
    (lambda p: p, "is not a regular file"),
    (lambda p: (p / "junk.sif").write_bytes(b"garbage" * 20) and p / "junk.sif",
     "is not a SIF image"),
    (lambda p: _sif(p / "a#b.sif"), "cannot be named in a definition's header"),
])
def test_a_bad_base_sif_is_exit_2_naming_the_flag_before_any_engine(
        tmp_path: Path, make: object, said: str) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    proc = run_cli(["image", "build", "base", "--engine", "apptainer", "--base-sif",
                    str(path), "--out", str(tmp_path / "out.sif")],
                   env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    assert "--base-sif" in proc.stderr and said in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out.sif").exists()


def test_base_sif_is_refused_with_docker_and_outside_build(tmp_path: Path) -> None:
    sif = _sif(tmp_path / "b.sif")
    docker = run_cli(["image", "build", "base", "--engine", "docker", "--base-sif", str(sif),
                      "--build-arg", "WHEELHOUSE=containers/wheelhouse"],
                     env={"DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
    assert docker.returncode == 2 and "--base-sif: for --engine apptainer" in docker.stderr
    test = run_cli(["image", "test", "base", "--engine", "apptainer", "--base-sif", str(sif)])
    assert test.returncode == 2 and "--base-sif: for `train image build`" in test.stderr


def test_the_header_becomes_a_localimage_on_the_sif_keeping_every_line_number(
        tmp_path: Path) -> None:
    d = parse(BASE_DEF)
    sif = _sif(tmp_path / "base ci.sif")
    text = localbase.on_local_sif(d, localbase.check_base_sif(sif))
    lines = text.splitlines()
    assert lines[:2] == ["Bootstrap: localimage", f"From: {sif}"]
    original = BASE_DEF.read_text().splitlines()
    first = original.index("%arguments")
    assert lines[first:] == original[first:]
    rewritten = tmp_path / "base.def"
    rewritten.write_text(text)
    again = parse(rewritten)
    assert again.header["bootstrap"][1] == "localimage"
    assert again.header["from"][1] == str(sif)
    assert {k: s.line for k, s in again.sections.items()} == \
        {k: s.line for k, s in d.sections.items()}
    assert localbase.header_arguments(d) == {"BASE_IMAGE"}


def test_only_the_arguments_the_rewritten_text_uses_are_passed() -> None:
    text = "Bootstrap: localimage\nFrom: /x.sif\n\n%post\n    echo {{ LOCK }}\n"
    assert localbase.used_arguments(text, {"LOCK": "a", "BASE_SIF": "/x.sif"}) == {"LOCK": "a"}


def test_relative_base_sif_is_made_absolute(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _sif(tmp_path / "b.sif")
    assert localbase.check_base_sif(Path("b.sif")) == tmp_path / "b.sif"
    with pytest.raises(UsageError, match="edge spaces"):
        localbase.check_base_sif(Path(" b.sif"))
