"""`train image` inputs checked before any engine starts (exit 2), definitions found from
anywhere, and the sc2 workload's up-front checks (exit 3 before anything is written)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from train.errors import EnvironmentUnavailable
from train.workloads.envs import pysc2_env

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def _repo(tmp_path: Path, files: str, args: str = "") -> Path:
    (tmp_path / "containers").mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text("a\n")
    path = tmp_path / "containers" / "img.def"
    path.write_text("Bootstrap: docker\nFrom: debian:12.6\n\n%arguments\n    URL=none\n"
                    f"{args}\n%files\n{files}\n%post\n    true\n")
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
    assert (out / "containers" / "patches" / "pysc2_shuffle.py").read_bytes() == (
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
