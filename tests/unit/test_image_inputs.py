"""`train image` inputs checked before any engine starts (exit 2), definitions found from
anywhere, and the sc2 workload's up-front checks (exit 3 before anything is written)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from train.common.errors import EnvironmentUnavailable
from train.images.defs import parse
from train.images.dockerfile import translate
from train.workloads.envs import pysc2_env

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def _repo(tmp_path: Path, files: str, args: str = "") -> Path:
    (tmp_path / "containers").mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("a\n")
    path = tmp_path / "containers" / "img.def"
    path.write_text("Bootstrap: docker\nFrom: debian:12.6\n\n%arguments\n    URL=none\n"
                    f"{args}\n%files\n{files}\n%post\n    true\n    echo {{{{ URL }}}}\n")
    return path


@pytest.mark.parametrize(("files", "build_arg", "message"), [
    ("    data /opt/data", "URL=file:///opt/data/b.txt",
     "build-arg URL: file:///opt/data/b.txt is missing: put it at"),
    ("    data /opt/data", "URL=file:///elsewhere/b.txt",
     "build-arg URL: file:///elsewhere/b.txt is not inside any %files destination"),
    ("    data /opt/data", "URL=a\nRUN touch /evil",
     "build-arg URL: the value holds a control character"),
    # lint's rules, run by the build before any engine
    ("    ../outside /opt/x", "URL=none", "img.def:8: [files-source] ../outside: escapes"),
    ("    /etc/passwd /opt/x", "URL=none", "img.def:8: [files-source] /etc/passwd: an "
     "absolute source"),
    ("    missing /opt/x", "URL=none", "img.def:8: [files-source] missing: does not exist"),
])
def test_build_refuses_bad_inputs_before_the_engine(tmp_path: Path, files: str, build_arg: str,
                                                    message: str) -> None:
    path = _repo(tmp_path, files)
    proc = run_cli(["image", "build", str(path), "--engine", "docker", "--build-arg",
                    build_arg], env=NO_ENGINE)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr


@pytest.mark.parametrize("engine", ["docker", "apptainer"])
def test_a_build_argument_the_definition_never_uses_is_exit_2_on_both_engines(
        tmp_path: Path, engine: str) -> None:
    """`apptainer build` stops at a build argument no placeholder uses ("unused build
    args"), even one %arguments declares: both engines refuse it before starting."""
    path = _repo(tmp_path, "    data /opt/data", args="    SPARE=1\n")
    proc = run_cli(["image", "build", str(path), "--engine", engine, "--build-arg",
                    "SPARE=2", "--out", str(tmp_path / "img.sif")],
                   env={**NO_ENGINE, "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stderr
    assert "build-arg SPARE: img.def declares it but uses it nowhere" in proc.stderr
    used = run_cli(["image", "build", str(path), "--engine", "docker", "--build-arg",
                    "URL=none"], env=NO_ENGINE)
    assert used.returncode == 3 and "no Docker engine reachable" in used.stderr, used.stderr


def test_build_refuses_a_symlink_out_of_the_repository(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    repo = tmp_path / "repo"
    repo.mkdir()
    path = _repo(repo, "    link /opt/x")
    (repo / "link").symlink_to(outside)
    proc = run_cli(["image", "build", str(path), "--engine", "docker"], env=NO_ENGINE)
    assert proc.returncode == 2 and "resolves outside the repository" in proc.stderr
    assert "[files-source]" in proc.stderr


def test_an_existing_stand_in_passes_the_checks_and_reaches_the_engine(tmp_path: Path) -> None:
    path = _repo(tmp_path, "    data /opt/data")
    proc = run_cli(["image", "build", str(path), "--engine", "docker", "--build-arg",
                    "URL=file:///opt/data/a.txt"], env=NO_ENGINE)
    assert proc.returncode == 3 and "no Docker engine reachable" in proc.stderr, proc.stderr


def test_defs_folder_without_definitions_is_exit_2(tmp_path: Path) -> None:
    for argv, env in ((["image", "lint", "--defs", str(tmp_path)], {}),
                      (["image", "translate", "base"], {"TRAIN_DEFS": str(tmp_path)})):
        proc = run_cli(argv, env=env)
        assert proc.returncode == 2, proc.stderr
        assert f"{tmp_path} holds no .def files" in proc.stderr


def test_image_commands_work_from_any_directory(tmp_path: Path) -> None:
    lint = run_cli(["image", "lint"], cwd=tmp_path)
    assert lint.returncode == 0 and "3 definition(s), 0 violation(s)" in lint.stderr
    out = tmp_path / "ctx"
    ctx = run_cli(["image", "translate", "sc2", "--localimage", "base.sif=b:1", "--out", "ctx"],
                  cwd=tmp_path)
    assert ctx.returncode == 0, ctx.stderr
    # the %files sources come from the repository, the context lands where the user is
    assert (out / "files" / "1" / "pysc2_shuffle.py").read_bytes() == (
        REPO / "containers" / "patches" / "pysc2_shuffle.py").read_bytes()
    assert f"build context written to {out}" in ctx.stdout


def _game(root: Path, binary: bytes = b"#!/bin/sh\n", mode: int = 0o755) -> Path:
    game = root / "Versions" / "Base75689" / "SC2_x64"
    game.parent.mkdir(parents=True)
    game.write_bytes(binary)
    game.chmod(mode)
    (root / "Maps" / "mini_games").mkdir(parents=True)
    (root / "Maps" / "mini_games" / "MoveToBeacon.SC2Map").write_text("map")
    return game


def test_sc2_check_names_what_is_missing_or_broken(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pysc2_env, "_import_pysc2", lambda mock: None)  # pysc2: the image's
    env = {"SC2PATH": str(tmp_path)}
    with pytest.raises(EnvironmentUnavailable, match="no Versions/Base\\*/SC2_x64"):
        pysc2_env.check_available(env)
    game = _game(tmp_path)
    assert pysc2_env.check_available(env) == tmp_path
    game.chmod(0o644)
    with pytest.raises(EnvironmentUnavailable, match="is broken"):
        pysc2_env.check_available(env)
    game.chmod(0o755)
    game.write_bytes(b"")
    with pytest.raises(EnvironmentUnavailable, match="is broken"):
        pysc2_env.check_available(env)
    game.write_bytes(b"#!/bin/sh\n")
    (tmp_path / "Maps" / "mini_games" / "MoveToBeacon.SC2Map").unlink()
    with pytest.raises(EnvironmentUnavailable, match=r"MoveToBeacon\.SC2Map"):
        pysc2_env.check_available(env)
    assert pysc2_env.check_available(env, mock=True) == tmp_path  # the mock needs no game


def test_sc2_check_reports_a_pysc2_that_fails_to_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """pysc2 4.0.0 under a newer protobuf raises TypeError at import, not ImportError."""
    import builtins

    real = builtins.__import__

    def fake(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("pysc2"):
            raise TypeError("Descriptors cannot be created directly.\nmore text")
        return real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(EnvironmentUnavailable, match="does not import here "
                       r"\(TypeError: Descriptors cannot be created directly.\)"):
        pysc2_env.check_available({"SC2PATH": "/nonexistent"})


def test_train_run_sc2_without_the_game_is_exit_3_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_cli(["run", "sc2", "--device", "cpu", "--out", str(out)],
                   env={"SC2PATH": str(tmp_path / "nothing")})
    assert proc.returncode == 3, proc.stderr
    assert not out.exists()
    mock = run_cli(["run", "sc2", "--sc2-env", "mock", "--device", "cpu", "--out", str(out)])
    assert mock.returncode == 3 and "pysc2" in mock.stderr and not out.exists()


@pytest.mark.parametrize(("edit", "rule"), [
    (("URL=none", "URL="), "arguments-empty"),
    (("    true\n", "    pip install --require-hashes --no-deps -r /opt/req/ok.txt\n"),
     "pip-lock"),
])
def test_build_refuses_what_lint_names_before_the_engine(tmp_path: Path,
                                                         edit: tuple[str, str],
                                                         rule: str) -> None:
    path = _repo(tmp_path, "    data /opt/data")
    (tmp_path / "containers" / "requirements").mkdir()
    (tmp_path / "containers" / "requirements" / "ok.txt").write_text("a==1\n")  # no --hash
    path.write_text(path.read_text().replace(*edit))
    proc = run_cli(["image", "build", str(path), "--engine", "docker"], env=NO_ENGINE)
    assert proc.returncode == 2, proc.stderr
    assert f"{path}:" in proc.stderr and f"[{rule}]" in proc.stderr


def _translate_out(path: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli(["image", "translate", str(path), "--out", str(out), *extra])


def test_a_files_source_never_replaces_the_generated_dockerfile(tmp_path: Path) -> None:
    path = _repo(tmp_path, "    Dockerfile /opt/Dockerfile\n    .train-build /opt/tb")
    (tmp_path / "Dockerfile").write_text("FROM alpine:3.19\nRUN echo UNINTENDED\n")
    (tmp_path / ".train-build").mkdir()
    (tmp_path / ".train-build" / "post").write_text("echo UNINTENDED\n")
    out = tmp_path.parent / f"{tmp_path.name}-ctx"
    proc = _translate_out(path, out)
    assert proc.returncode == 0, proc.stderr
    assert (out / "Dockerfile").read_text().startswith("# Generated from img.def")
    assert "UNINTENDED" not in (out / ".train-build" / "post").read_text()
    assert (out / "files" / "0" / "Dockerfile").read_text().endswith("UNINTENDED\n")


def test_translate_out_refuses_what_it_would_clobber_and_leaves_nothing(tmp_path: Path) -> None:
    path = _repo(tmp_path, "    data /opt/data")
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    for out, message in ((afile, "already exists"), (tmp_path / "data",
                                                     "already exists"),
                         (tmp_path / "data" / "ctx", "inside the %files source")):
        proc = _translate_out(path, out)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert afile.read_text() == "mine\n"
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["a.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize(("target", "message"), [
    ("/etc/hostname", "links outside the repository"),
    ("/nonexistent/x", "dangling or looping"),
    (".", "looping symbolic link"),  # copying it would never end
])
def test_links_inside_a_files_folder_are_checked(tmp_path: Path, target: str,
                                                 message: str) -> None:
    path = _repo(tmp_path, "    data /opt/data")
    (tmp_path / "data" / "link").symlink_to(target)
    proc = run_cli(["image", "build", str(path), "--engine", "docker"], env=NO_ENGINE)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_build_needs_a_source_tree(tmp_path: Path) -> None:
    path = _repo(tmp_path, "    data /opt/data")
    (tmp_path / "pyproject.toml").unlink()
    proc = run_cli(["image", "build", str(path), "--engine", "docker"], env=NO_ENGINE)
    assert proc.returncode == 2 and "is not a source tree" in proc.stderr


@pytest.mark.parametrize(("argv", "message"), [
    ([], "give the docker tag built from it"),
    (["--localimage", "base.sif=img:1\nRUN touch /PWNED"], "localimage base.sif: the value"),
    (["--localimage", "base.sif="], "is not a docker image reference"),
])
def test_translation_errors_come_before_the_engine(tmp_path: Path, argv: list[str],
                                                   message: str) -> None:
    path = _repo(tmp_path, "    data /opt/data")
    path.write_text(path.read_text().replace("Bootstrap: docker\nFrom: debian:12.6",
                                             "Bootstrap: localimage\nFrom: base.sif"))
    proc = run_cli(["image", "build", str(path), "--engine", "docker", *argv], env=NO_ENGINE)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_translate_to_stdout_refuses_control_characters(tmp_path: Path) -> None:
    path = _repo(tmp_path, "    data /opt/data")
    proc = run_cli(["image", "translate", str(path), "--build-arg", "URL=x\nRUN touch /PWNED"])
    assert proc.returncode == 2 and "build-arg URL: the value holds" in proc.stderr
    assert "PWNED" not in proc.stdout


def test_files_copies_follow_apptainer_splitting_and_destinations(tmp_path: Path) -> None:
    path = _repo(tmp_path, '    data/a.txt /\n    "data/my file" "/opt/my file"\n')
    (tmp_path / "data" / "my file").write_text("x\n")
    t = translate(parse(path))
    assert "mkdir -p /\ncp -fLr /.train/files/0/a.txt /\n" in t.scripts["files"]
    assert "cp -fLr '/.train/files/1/my file' '/opt/my file'" in t.scripts["files"]
    assert 'COPY ["files/1/my file", "/.train/files/1/my file"]' in t.dockerfile
    (tmp_path / "b").mkdir()
    bad = _repo(tmp_path / "b", "    data /.train/files/0")
    proc = run_cli(["image", "translate", str(bad)])
    assert proc.returncode == 2 and "stages its own files" in proc.stderr


def test_environment_lines_are_read_as_the_shell_reads_them(tmp_path: Path) -> None:
    path = _repo(tmp_path, "    data /opt/data")
    path.write_text(path.read_text() + "\n%environment\n"
                    '    export PATH="/opt/venv/bin:$PATH"\n'
                    "    export LANG='C.UTF-8' A=1 B=\"two words\"  # a comment\n")
    lines = translate(parse(path)).dockerfile.splitlines()
    assert "ENV PATH=/opt/venv/bin:$PATH" in lines
    assert "ENV LANG=C.UTF-8" in lines and "ENV A=1" in lines
    assert 'ENV B="two words"' in lines


def test_content_listing_is_one_line_per_entry_for_odd_names(tmp_path: Path) -> None:
    import os

    from train.images.content import listing

    (tmp_path / "new\nline").write_text("")
    os.symlink(b"\xff", bytes(tmp_path / "badlink"))
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to(".")
    lines = sorted(listing(str(tmp_path)))
    assert len(lines) == 4 and all("\n" not in line for line in lines)
    assert any(line.endswith(" /new\\x0aline") for line in lines)
    assert any(line.startswith("p") and line.endswith(" /fifo") for line in lines)
    assert lines == sorted(listing(str(tmp_path)))


def test_sc2_check_looks_at_the_build_pysc2_runs(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pysc2_env, "_import_pysc2", lambda mock: None)
    _game(tmp_path)  # Base75689 with a binary
    older = tmp_path / "Versions" / "Base9" / "SC2_x64"
    older.parent.mkdir()
    older.write_bytes(b"#!/bin/sh\n")
    older.chmod(0o755)
    assert pysc2_env.check_available({"SC2PATH": str(tmp_path)}) == tmp_path
    (tmp_path / "Versions" / "Base80000").mkdir()  # newest, without its binary
    with pytest.raises(EnvironmentUnavailable, match="Base80000/SC2_x64"):
        pysc2_env.check_available({"SC2PATH": str(tmp_path)})
