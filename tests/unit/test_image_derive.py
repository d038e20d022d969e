"""`train image new`: a derived definition and a lock of only what it adds, resolved by the
real pip against the base image's lock, offline: the "index" is a folder of tiny wheels this
test writes (--find-links), so no test reaches the network. Every bad-requirements case is
exit 2 with nothing written."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

from train.cli import main
from train.images.defs import containers_dir
from train.images.derive import read_lock
from train.images.lint import lint_def

CONTAINERS = containers_dir()
BASE_PINS = read_lock(CONTAINERS / "requirements" / "base-cu130.txt")


def make_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = (),
               tag: str = "py3-none-any") -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD and one module)."""
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                            + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                         f"Tag: {tag}\n",
    }
    path = folder / f"{module}-{version}-{tag}.whl"
    record = []
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest())
            record.append(f"{member},sha256={digest.rstrip(b'=').decode()},{len(text)}")
        archive.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def index(tmp_path: Path) -> Path:
    """The wheels pip may choose from: the user's packages, one that needs an old numpy,
    one built for CPython 3.11 only, one with only a source archive, and stand-ins for
    the base's numpy and setuptools at the base lock's versions."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels, "extra-pkg", "1.2.0", ("numpy>=1.20", "helper-pkg>=0.2"))
    make_wheel(wheels, "helper-pkg", "0.3")
    make_wheel(wheels, "helper-pkg", "0.1")
    make_wheel(wheels, "old-numpy-user", "1.0", ("numpy<2",))
    make_wheel(wheels, "numpy", BASE_PINS["numpy"].version)
    make_wheel(wheels, "numpy", "1.26.4")
    make_wheel(wheels, "setuptools", BASE_PINS["setuptools"].version)
    make_wheel(wheels, "only-cp311", "1.0", tag="cp311-cp311-manylinux_2_28_x86_64")
    (wheels / "only_sdist-1.0.tar.gz").write_bytes(b"not a wheel")
    return wheels


def new(tmp_path: Path, index: Path, requirements: str, *extra: str) -> int:
    req = tmp_path / "requirements.txt"
    req.write_text(requirements, encoding="utf-8")
    return main(["image", "new", "myproj", "--requirements", str(req), "--find-links",
                 str(index), "--out", str(tmp_path / "containers-myproj"), *extra])


def test_derive_writes_a_lock_of_only_what_it_adds(
        tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert new(tmp_path, index, "extra-pkg==1.2.0  # the one I need\n") == 0
    # the folder above has no pyproject.toml or .git: `image build` would refuse it
    assert "has no pyproject.toml or .git" in capsys.readouterr().err
    (tmp_path / ".git").mkdir()
    assert new(tmp_path, index, "extra-pkg==1.2.0\n") == 0
    assert "note:" not in capsys.readouterr().err
    folder = tmp_path / "containers-myproj"
    lock = read_lock(folder / "requirements" / "myproj.txt")
    # numpy is the base's (dropped); helper-pkg's newest allowed version, with its hash
    assert sorted(lock) == ["extra-pkg", "helper-pkg"]
    assert lock["helper-pkg"].version == "0.3"
    assert lock["extra-pkg"].hashes == (sha256(index / "extra_pkg-1.2.0-py3-none-any.whl"),)
    assert lock["helper-pkg"].hashes == (sha256(index / "helper_pkg-0.3-py3-none-any.whl"),)
    definition = (folder / "myproj.def").read_text(encoding="utf-8")
    assert "Bootstrap: localimage\nFrom: {{ BASE_SIF }}\n" in definition
    assert "    BASE_SIF=base.sif\n" in definition
    assert "--require-hashes --no-deps -r /opt/train/requirements/myproj.txt" in definition
    assert lint_def(folder / "myproj.def") == []
    assert main(["image", "lint", str(folder / "myproj.def")]) == 0


def test_derive_from_sc2_keeps_the_sc2_pins_and_environment(tmp_path: Path,
                                                            index: Path) -> None:
    assert new(tmp_path, index, "helper-pkg\n", "--from", "sc2") == 0
    folder = tmp_path / "containers-myproj"
    definition = (folder / "myproj.def").read_text(encoding="utf-8")
    assert "    BASE_SIF=sc2.sif\n" in definition
    assert "export SC2PATH=/opt/sc2/StarCraftII" in definition
    assert "sc2.txt" in (folder / "requirements" / "myproj.txt").read_text(encoding="utf-8")
    assert lint_def(folder / "myproj.def") == []


def test_editable_project_is_copied_and_installed_and_its_dependencies_locked(
        tmp_path: Path, index: Path) -> None:
    project = tmp_path / "myproject"
    (project / "myproject").mkdir(parents=True)
    (project / "myproject" / "__init__.py").write_text("", encoding="utf-8")
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = '
        '"setuptools.build_meta"\n[project]\nname = "myproject"\nversion = "0.1"\n'
        'dependencies = ["helper-pkg>=0.2"]\n', encoding="utf-8")
    assert new(tmp_path, index, "", "--editable", str(project)) == 0
    folder = tmp_path / "containers-myproj"
    definition = (folder / "myproj.def").read_text(encoding="utf-8")
    assert "    myproject /opt/src/myproj\n" in definition
    assert "--no-build-isolation -e /opt/src/myproj" in definition
    # setuptools is the base's; the project's dependency is added
    assert sorted(read_lock(folder / "requirements" / "myproj.txt")) == ["helper-pkg"]
    assert lint_def(folder / "myproj.def") == []


@pytest.mark.parametrize(("requirements", "named"), [
    # a pin of the base's own packages that the base lock does not satisfy
    ("torch==2.5.0\n", "torch==2.5.0"),
    ("numpy<2\n", "numpy<2"),
    ("nvidia-nccl-cu13==2.18.1\n", "nvidia-nccl-cu13==2.18.1"),
    # a package whose own dependency conflicts with the base's numpy (found by pip)
    ("old-numpy-user==1.0\n", "old-numpy-user"),
    # nothing pip can pin by hash from an index
    ("git+https://github.com/example/pkg.git@main\n", "git+https://github.com/example/pkg"),
    ("pkg @ https://example.org/pkg-1.0.tar.gz\n", "pkg @ https://example.org"),
    ("./mypkg\n", "./mypkg"),
    ("-e ./mypkg\n", "-e ./mypkg"),
    # no wheel for the image's CPython 3.12 on manylinux x86_64
    ("only-cp311==1.0\n", "only-cp311"),
    ("only-sdist==1.0\n", "only-sdist"),
    ("not-on-the-index==1.0\n", "not-on-the-index"),
    # a marker that compares what cannot be compared
    ('helper-pkg; python_version ~= "abc"\n', "requirements.txt:1: 'helper-pkg"),
    # a hash option that is not sha256 of 64 hex digits
    ("helper-pkg==0.3 --hash=md5:00ff\n", "--hash=md5:00ff"),
])
def test_bad_requirements_exit_2_naming_it_and_write_nothing(
        tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str],
        requirements: str, named: str) -> None:
    assert new(tmp_path, index, requirements) == 2
    err = capsys.readouterr().err
    assert named in err, err
    assert not (tmp_path / "containers-myproj").exists()


def test_bad_name_and_editable_outside_exit_2(tmp_path: Path, index: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    req = tmp_path / "r.txt"
    req.write_text("helper-pkg\n", encoding="utf-8")
    assert main(["image", "new", "base", "--requirements", str(req), "--find-links",
                 str(index), "--out", str(tmp_path / "c")]) == 2
    assert "NAME 'base'" in capsys.readouterr().err
    outside = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    outside.mkdir()
    assert new(tmp_path, index, "helper-pkg\n", "--editable", str(outside)) == 2
    assert "--editable" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
    assert not (tmp_path / "containers-myproj").exists()


def test_running_new_again_keeps_each_earlier_definition_and_writes_nothing_when_same(
        tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "containers-myproj"
    definition, lock = folder / "myproj.def", folder / "requirements" / "myproj.txt"
    assert new(tmp_path, index, "helper-pkg==0.3\n") == 0
    written = definition.read_text(encoding="utf-8")
    definition.write_text(written + "# my own edit\n", encoding="utf-8")
    capsys.readouterr()
    assert new(tmp_path, index, "helper-pkg==0.3\n") == 0
    assert f"as {folder / 'myproj.def.1'}" in capsys.readouterr().err
    assert (folder / "myproj.def.1").read_text(encoding="utf-8").endswith("# my own edit\n")
    assert definition.read_text(encoding="utf-8") == written
    # the same content again: nothing written, no copy
    before = (definition.stat().st_ino, lock.stat().st_ino)
    assert new(tmp_path, index, "helper-pkg==0.3\n") == 0
    assert capsys.readouterr().out.startswith("unchanged:")
    assert (definition.stat().st_ino, lock.stat().st_ino) == before
    assert not (folder / "myproj.def.2").exists()
    # a new lock and another edit: copies numbered on, the first never replaced
    definition.write_text(written + "# second edit\n", encoding="utf-8")
    assert new(tmp_path, index, "helper-pkg==0.1\n") == 0
    assert (folder / "myproj.def.1").read_text(encoding="utf-8").endswith("# my own edit\n")
    assert (folder / "myproj.def.2").read_text(encoding="utf-8").endswith("# second edit\n")
    assert "helper-pkg==0.3" in (folder / "requirements" / "myproj.txt.1").read_text()
    assert read_lock(lock)["helper-pkg"].version == "0.1"


def test_markers_are_evaluated_for_the_images_python_and_a_dropped_line_is_named(
        tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the base image is Ubuntu 24.04's CPython 3.12 on Linux x86_64, whatever runs train
    assert new(tmp_path, index, 'helper-pkg==0.3; python_version >= "3.12"\n'
               'extra-pkg; python_version < "3.12"\n'
               'old-numpy-user; sys_platform == "win32"\n'
               'only-cp311; platform_machine == "aarch64"\n') == 0
    lock = read_lock(tmp_path / "containers-myproj" / "requirements" / "myproj.txt")
    assert sorted(lock) == ["helper-pkg"]
    err = capsys.readouterr().err
    for line in ("requirements.txt:2 'extra-pkg; python_version < \"3.12\"'",
                 "requirements.txt:3 'old-numpy-user", "requirements.txt:4 'only-cp311"):
        assert line in err, err
    assert "CPython 3.12" in err


def _containers_with(tmp_path: Path, base_image: str) -> Path:
    """A copy of the definitions folder whose base.def starts from another image."""
    import shutil

    copy = tmp_path / "defs"
    shutil.copytree(CONTAINERS, copy, ignore=shutil.ignore_patterns("wheelhouse", "downloads"))
    text = (copy / "base.def").read_text(encoding="utf-8")
    (copy / "base.def").write_text(
        text.replace("BASE_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04",
                     f"BASE_IMAGE={base_image}"), encoding="utf-8")
    return copy


def test_the_images_python_follows_base_defs_base_image_and_unknown_is_said(
        tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    defs = _containers_with(tmp_path, "nvidia/cuda:12.8.1-runtime-ubuntu22.04")
    assert new(tmp_path, index, 'helper-pkg; python_version == "3.10"\n',
               "--defs", str(defs)) == 0
    assert "CPython 3.10" in (tmp_path / "containers-myproj" / "requirements" /
                              "myproj.txt").read_text(encoding="utf-8")
    defs = _containers_with(tmp_path / "other", "debian:12")
    assert new(tmp_path / "other", index, "helper-pkg\n", "--defs", str(defs)) == 2
    err = capsys.readouterr().err
    assert "BASE_IMAGE 'debian:12'" in err and "not known" in err, err


@pytest.mark.parametrize(("pyproject", "named"), [
    ('[project]\nname = "p"\ndependencies = "helper-pkg"\n', "[project] dependencies"),
    ('[project]\nname = "p"\ndependencies = {a = "b"}\n', "[project] dependencies"),
    ('project = [1, 2]\n', "[project] must be a table"),
    ('[project]\nname = "p"\noptional-dependencies = "x"\n',
     "[project] optional-dependencies"),
    ('[project]\nname = "p"\n[project.optional-dependencies]\ndev = "pytest"\n',
     "[project.optional-dependencies] dev"),
    ('[project]\nname = "p"\ndynamic = "dependencies"\n', "[project] dynamic"),
    ('build-system = 3\n', "[build-system] must be a table"),
    ('[build-system]\nrequires = "setuptools"\n', "[build-system] requires"),
    ('[project\nname = "p"\n', "is not TOML"),
    (b'\xff\xfe[project]\n', "cannot read"),
])
def test_odd_pyproject_types_exit_2_naming_the_file_and_key(
        tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str],
        pyproject: str | bytes, named: str) -> None:
    project = tmp_path / "myproject"
    project.mkdir()
    data = pyproject if isinstance(pyproject, bytes) else pyproject.encode()
    (project / "pyproject.toml").write_bytes(data)
    assert new(tmp_path, index, "", "--editable", str(project)) == 2
    err = capsys.readouterr().err
    assert str(project / "pyproject.toml") in err and named in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "containers-myproj").exists()


def test_an_out_that_is_a_file_exits_2_and_leaves_it_as_it_was(
        tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    req = tmp_path / "requirements.txt"
    req.write_text("helper-pkg\n", encoding="utf-8")
    afile = tmp_path / "notes.txt"
    afile.write_text("mine\n", encoding="utf-8")
    for out in (afile, afile / "sub"):
        assert main(["image", "new", "myproj", "--requirements", str(req), "--find-links",
                     str(index), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert "--out" in err and "a file, not a folder" in err, err
    assert afile.read_text(encoding="utf-8") == "mine\n"


def test_links_planted_at_temp_and_target_names_are_never_written_through(
        tmp_path: Path, index: Path) -> None:
    # another user's links in a shared --out: at the names the old temp files had, at the
    # lock (to a file of theirs), dangling ones at wheels/README and the definition
    folder = tmp_path / "containers-myproj"
    (folder / "requirements").mkdir(parents=True)
    (folder / "wheels").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    victims = {n: outside / n for n in ("def", "txt", "lock")}
    for victim in victims.values():
        victim.write_text("theirs\n", encoding="utf-8")
    (folder / ".myproj.def.tmp").symlink_to(victims["def"])
    (folder / "requirements" / ".myproj.txt.tmp").symlink_to(victims["txt"])
    (folder / "requirements" / "myproj.txt").symlink_to(victims["lock"])
    (folder / "wheels" / "README").symlink_to(outside / "created")
    (folder / "myproj.def").symlink_to(outside / "made-too")
    assert new(tmp_path, index, "helper-pkg==0.3\n") == 0
    assert all(v.read_text(encoding="utf-8") == "theirs\n" for v in victims.values())
    assert not (outside / "created").exists() and not (outside / "made-too").exists()
    assert sorted(p.name for p in outside.iterdir()) == ["def", "lock", "txt"]
    lock = folder / "requirements" / "myproj.txt"
    assert not lock.is_symlink() and read_lock(lock)["helper-pkg"].version == "0.3"
    assert (folder / "requirements" / "myproj.txt.1").read_text(encoding="utf-8") == \
        "theirs\n"  # what the link showed, kept
    assert not (folder / "myproj.def").is_symlink()
    assert list(folder.glob(".myproj.def.*.tmp")) == []


def test_a_hashed_pip_compile_file_is_read_with_each_requirements_hashes(
        tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    extra = sha256(index / "extra_pkg-1.2.0-py3-none-any.whl")
    helper = sha256(index / "helper_pkg-0.3-py3-none-any.whl")
    other = "ab" * 32
    compiled = ("#\n# This file is autogenerated by pip-compile with Python 3.12\n#\n"
                f"extra-pkg==1.2.0 \\\n    --hash=sha256:{other} \\\n"
                f"    --hash=sha256:{extra}\n    # via -r requirements.in\n"
                f"helper-pkg==0.3 ; python_version >= \"3.8\" \\\n"
                f"    --hash=sha256:{helper.upper()}\n    # via extra-pkg\n"
                f"numpy=={BASE_PINS['numpy'].version} \\\n    --hash=sha256:{other}\n")
    assert new(tmp_path, index, compiled) == 0, capsys.readouterr().err
    lock = read_lock(tmp_path / "containers-myproj" / "requirements" / "myproj.txt")
    assert lock["extra-pkg"].hashes == (extra,) and lock["helper-pkg"].hashes == (helper,)
    # a wheel whose sha256 the file does not list: named, nothing written
    (tmp_path / "x").mkdir()
    assert new(tmp_path / "x", index, compiled.replace(helper.upper(), other)) == 2
    err = capsys.readouterr().err
    assert "requirements.txt:8" in err and "helper-pkg==0.3" in err and "--hash" in err, err
    assert not (tmp_path / "x" / "containers-myproj").exists()


def test_duplicate_lines_count_once_and_conflicting_pins_exit_2_naming_both(
        tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert new(tmp_path, index, "helper-pkg==0.3\n" * 10_000 + "helper_pkg == 0.3\n") == 0
    assert "10000 requirement(s) repeated an earlier one" in capsys.readouterr().err
    assert sorted(read_lock(tmp_path / "containers-myproj" / "requirements" /
                            "myproj.txt")) == ["helper-pkg"]
    other = tmp_path / "other"
    other.mkdir()
    assert new(other, index, "helper-pkg>=0.1\nhelper-pkg==0.3\nextra-pkg\n"
               "helper-pkg==0.1\n") == 2
    err = capsys.readouterr().err
    assert "requirements.txt:2 'helper-pkg==0.3'" in err, err
    assert "requirements.txt:4 'helper-pkg==0.1'" in err, err
    assert not (other / "containers-myproj").exists()


def test_a_pip_too_old_is_named_with_its_upgrade_and_nothing_is_written(
        tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import pip

    monkeypatch.setattr(pip, "__version__", "22.0.4")
    assert new(tmp_path, index, "helper-pkg\n") == 2
    err = capsys.readouterr().err
    assert "pip 22.0.4" in err and "pip >= 23.0" in err and "install --upgrade pip" in err
    assert not (tmp_path / "containers-myproj").exists()


def test_only_a_resolver_conflict_blames_the_base_images_pins() -> None:
    from train.images.derive_reqs import Target, pip_refusal

    target = Target("3.12", "3.12.3", 39)
    option = pip_refusal("ERROR: Can not use any platform or abi specific options unless "
                         "installing via '--target'\n", target)
    assert "base image's pins" not in option and "--target" in option
    conflict = pip_refusal("ERROR: Cannot install a because these package versions have "
                           "conflicting dependencies.\nThe user requested numpy<2\n"
                           "The user requested (constraint) numpy==2.3.5\n", target)
    assert "base image's pins" in conflict and "numpy<2" in conflict


def test_a_requirement_with_a_terminal_escape_is_named_without_the_escape(
        tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert new(tmp_path, index, "\x1b[31mhelper-pkg==0.3\n") == 2
    err = capsys.readouterr().err
    assert "requirements.txt:1: '\\x1b[31mhelper-pkg==0.3' is not a requirement" in err, err
    assert "\x1b" not in err, repr(err)
    assert not (tmp_path / "containers-myproj").exists()


def test_wheels_tagged_for_any_glibc_the_image_has_are_taken_and_a_newer_one_is_not(
        tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # wandb 0.22.0's shape: only manylinux_2_17/manylinux2014 wheels (pip in Ubuntu 24.04,
    # glibc 2.39, installs them); unpinned, the newest release is taken, not an older one
    # that has a pure-Python wheel
    make_wheel(index, "glibc-pkg", "2.0",
               tag="py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64")
    make_wheel(index, "glibc-pkg", "1.0")
    make_wheel(index, "legacy-pkg", "1.0", tag="cp312-cp312-manylinux2014_x86_64")
    make_wheel(index, "plain-linux-pkg", "1.0", tag="py3-none-linux_x86_64")
    make_wheel(index, "glibc39-pkg", "1.0", tag="py3-none-manylinux_2_39_x86_64")
    assert new(tmp_path, index, "glibc-pkg\nlegacy-pkg==1.0\nplain-linux-pkg\n"
               "glibc39-pkg\n") == 0
    lock = read_lock(tmp_path / "containers-myproj" / "requirements" / "myproj.txt")
    assert {name: pin.version for name, pin in lock.items()} == {
        "glibc-pkg": "2.0", "legacy-pkg": "1.0", "plain-linux-pkg": "1.0",
        "glibc39-pkg": "1.0"}
    # a wheel for a glibc newer than the image's 2.39 would not load there
    make_wheel(index, "glibc40-pkg", "1.0", tag="py3-none-manylinux_2_40_x86_64")
    (tmp_path / "newer").mkdir()
    assert new(tmp_path / "newer", index, "glibc40-pkg\n") == 2
    err = capsys.readouterr().err
    assert "glibc40-pkg" in err and "glibc 2.39" in err, err


def test_wheels_of_the_older_manylinux_tags_pip_in_the_image_installs_are_taken(
        tmp_path: Path, index: Path) -> None:
    # pip in the image installs manylinux_2_5 .. 2_16, manylinux2010 and manylinux1 wheels
    # too (packaging's tags for glibc 2.39); only 2_17 and newer were given to pip
    make_wheel(index, "ml2010-pkg", "1.0",
               tag="cp312-cp312-manylinux_2_12_x86_64.manylinux2010_x86_64")
    make_wheel(index, "ml1-pkg", "1.0", tag="py3-none-manylinux1_x86_64")
    make_wheel(index, "ml216-pkg", "1.0", tag="py3-none-manylinux_2_16_x86_64")
    assert new(tmp_path, index, "ml2010-pkg==1.0\nml1-pkg\nml216-pkg\n") == 0
    lock = read_lock(tmp_path / "containers-myproj" / "requirements" / "myproj.txt")
    assert sorted(lock) == ["ml1-pkg", "ml2010-pkg", "ml216-pkg"]


def test_a_version_not_published_is_refused_with_every_version_there_is(
        tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str]) -> None:
    versions = [f"0.{minor}.0" for minor in range(80)]
    for version in versions:
        make_wheel(index, "many-pkg", version)
    assert new(tmp_path, index, "many-pkg==1.0.0\n") == 2
    err = capsys.readouterr().err
    assert "many-pkg==1.0.0" in err and ", ".join(versions) in err, err


def test_new_names_the_extra_that_the_lint_it_suggests_needs(
        tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "spython" else real(name, *a))
    assert new(tmp_path, index, "helper-pkg\n") == 0
    out, err = capsys.readouterr()
    assert "next: train image lint" in out
    assert "`train image lint` needs the image tools" in err
    assert "pip install './[images]'" in err and "train-slurm-apptainer" in err, err


@pytest.mark.parametrize("planted", ["myproj.def", "requirements/myproj.txt", "wheels"])
def test_a_fifo_or_dangling_folder_link_in_out_exits_2_before_resolving(
        tmp_path: Path, index: Path, capsys: pytest.CaptureFixture[str],
        planted: str) -> None:
    """A FIFO at NAME.def or the lock's name hung `image new` for ever (the read of what
    was there, to compare or keep it); a dangling link at wheels/ was 'File exists'
    after requirements/ was made."""
    import os
    import threading

    folder = tmp_path / "containers-myproj"
    (folder / "requirements").mkdir(parents=True)
    if planted == "wheels":
        (folder / "wheels").symlink_to(tmp_path / "nowhere")
    else:
        os.mkfifo(folder / planted)
    stop = threading.Event()

    def free_reads() -> None:  # a read blocked on the FIFO gets its end: fails, not hangs
        while not stop.wait(0.1):
            try:
                os.close(os.open(folder / planted, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # (no reader, or no FIFO)
                continue

    feeder = threading.Thread(target=free_reads, daemon=True)
    feeder.start()
    try:
        assert new(tmp_path, index, "helper-pkg==0.3\n") == 2
    finally:
        stop.set()
        feeder.join()
    err = capsys.readouterr().err
    assert f"--out: {folder / planted} is in the way" in err, err
    assert not (tmp_path / "nowhere").exists()
