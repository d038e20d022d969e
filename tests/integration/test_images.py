"""Real image builds: the base image from base.def through the translator and a real Docker
engine (what CI does). The Apptainer builds of the same definitions, by the real Apptainer
as an ordinary user, are in test_apptainer_images.py."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tests.integration.conftest import CI_BUILD_ARGS, CI_IMAGE_TAG, sc2_build_args

pytestmark = pytest.mark.slow


@pytest.mark.docker
def test_ci_builds_the_base_image_runs_its_test_and_the_demo_and_exports(
        tmp_path: Path, docker_engine: dict[str, str]) -> None:
    import docker

    build = run_cli(["image", "build", "base", "--engine", "docker", "--tag", CI_IMAGE_TAG,
                     *CI_BUILD_ARGS], env=docker_engine, timeout=1200)
    assert build.returncode == 0, build.stderr
    image = docker.from_env().images.get(CI_IMAGE_TAG)
    labels = image.labels
    assert labels["org.train.lock"] == "base-cpu.txt"
    assert labels["org.train.torch"] == "2.13.0"
    env = dict(e.split("=", 1) for e in image.attrs["Config"]["Env"])
    assert env["PYTORCH_CUDA_ALLOC_CONF"].startswith("expandable_segments:True")
    assert env["PYTHONUNBUFFERED"] == "1"
    # %environment's $PATH filled in from the base's, as Docker's ENV does
    assert env["PATH"].startswith("/opt/venv/bin:/usr/local/sbin:"), env["PATH"]

    test = run_cli(["image", "test", "base", "--engine", "docker", "--tag", CI_IMAGE_TAG],
                   env=docker_engine, timeout=600)
    assert test.returncode == 0, test.stderr
    assert "torch 2.13.0+cpu" in test.stdout  # %test ran
    assert "CUDA available False" in test.stdout
    assert "run complete: /tmp/train-demo" in test.stdout  # the demo trained inside

    out = tmp_path / "base.tar"
    export = run_cli(["image", "export", "base", "--engine", "docker", "--tag", CI_IMAGE_TAG,
                      "--out", str(out)], env=docker_engine, timeout=600)
    assert export.returncode == 0, export.stderr
    assert f"apptainer build base.sif docker-archive://{out}" in export.stdout
    with tarfile.open(out) as tar:
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
    assert manifest[0]["RepoTags"] == [CI_IMAGE_TAG]


@pytest.mark.docker
def test_bad_build_argument_fails_before_building(docker_engine: dict[str, str]) -> None:
    proc = run_cli(["image", "build", "base", "--engine", "docker", "--build-arg",
                    "CUDA=12"], env=docker_engine)
    assert proc.returncode == 2
    assert "build-arg CUDA: base.def has no such argument" in proc.stderr


EVERY_ACTION = """
from train.workloads.envs.pysc2_env import Pysc2Env
from train.workloads.envs.spec import ObsSpec
env = Pysc2Env(16, 8, 1, mock=True)
obs = env.reset()
for action in range(ObsSpec(16).n_actions):
    env.step(action)
print("converted", env.converted, "of", ObsSpec(16).n_actions, "available", obs.available)
"""


def _docker(tag: str, command: list[str], entrypoint: list[str] | None = None,
            environment: dict[str, str] | None = None) -> tuple[int, str]:
    import docker

    container = docker.from_env().containers.run(tag, command, entrypoint=entrypoint,
                                                 environment=environment or {},
                                                 network_mode="none", detach=True)
    try:
        code = container.wait(timeout=600)["StatusCode"]
        return code, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


@pytest.mark.docker
def test_sc2_image_imports_pysc2_runs_its_test_and_trains_on_pysc2s_mock_environment(
        sc2_image: str, docker_engine: dict[str, str]) -> None:
    # image test: %test (pysc2 imports on the image's Python with the locked protobuf), then
    # the definition's smoke run: train run sc2 on pysc2's own mock environment
    test = run_cli(["image", "test", "sc2", "--engine", "docker", "--tag", sc2_image],
                   env=docker_engine, timeout=900)
    assert test.returncode == 0, test.stderr
    assert "pysc2 ok, protobuf 3.20.3" in test.stdout
    # 3 episodes and 1 evaluation episode of the mock's 10 steps, every action converted
    assert "pysc2 mock environment: 40 actions, every one accepted" in test.stdout
    assert "run complete: /tmp/train-sc2-mock" in test.stdout
    # every action the agent can send, through pysc2's transform_action
    code, out = _docker(sc2_image, ["-c", EVERY_ACTION], entrypoint=["python"])
    assert code == 0, out
    assert "converted 258 of 258 available [ True  True  True]" in out


@pytest.mark.docker
def test_sc2_run_without_a_working_game_is_exit_3_before_anything_is_written(
        sc2_image: str) -> None:
    run = "python -m train run sc2 --device cpu --out /tmp/run; echo rc=$?; ls -d /tmp/run"
    code, out = _docker(sc2_image, ["-c", run], entrypoint=["/bin/sh"],
                        environment={"SC2PATH": "/opt/nothing"})
    assert "rc=3" in out and "has no Versions/Base*/SC2_x64" in out, out
    assert code != 0 and "No such file or directory" in out  # /tmp/run was never made
    # CI's stand-in game is executable but exits at once: pysc2 cannot connect to it
    code, out = _docker(sc2_image, ["-c", run], entrypoint=["/bin/sh"])
    assert "rc=3" in out and "did not start (ConnectError" in out, out
    broken = ("chmod -x $SC2PATH/Versions/Base*/SC2_x64; " + run)
    code, out = _docker(sc2_image, ["-c", broken], entrypoint=["/bin/sh"])
    assert "rc=3" in out and "is broken: it must be a non-empty executable" in out, out
    assert code != 0 and "No such file or directory" in out


@pytest.mark.docker
def test_image_test_fails_when_any_check_of_its_test_fails(sc2_image: str,
                                                          docker_engine: dict[str, str]) -> None:
    """%test runs as a plain /bin/sh script, as Apptainer runs it: without `set -e` only its
    last command would count. Break the map check (not the last) and the test must fail."""
    import io

    import docker

    client = docker.from_env()
    dockerfile = (f"FROM {sc2_image}\n"
                  "RUN rm /opt/sc2/StarCraftII/Maps/mini_games/MoveToBeacon.SC2Map\n")
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag="train/sc2:broken",
                        network_mode="none", rm=True)
    try:
        test = run_cli(["image", "test", "sc2", "--engine", "docker", "--tag",
                        "train/sc2:broken"], env=docker_engine, timeout=600)
        assert test.returncode != 0
        assert "/.train/test exited with 1" in test.stderr, test.stderr
    finally:
        client.images.remove("train/sc2:broken", force=True)


@pytest.mark.docker
def test_a_directory_copied_onto_an_existing_one_nests_as_in_apptainer(
        ci_image: str, docker_engine: dict[str, str], tmp_path: Path) -> None:
    """%files are copied with Apptainer's `cp -fLr`, not Docker's merging COPY: the trap that
    made derived images install the base's stale lock is visible in CI's build too."""
    repo = tmp_path / "repo"
    (repo / "containers" / "requirements").mkdir(parents=True)
    (repo / "pyproject.toml").write_text("")
    (repo / "containers" / "requirements" / "new.txt").write_text("new\n")
    (repo / "containers" / "nest.def").write_text(
        "Bootstrap: localimage\nFrom: base.sif\n\n%files\n"
        "    containers/requirements /opt/train/requirements\n\n"
        "%test\n    set -e\n    test -f /opt/train/requirements/requirements/new.txt\n"
        "    test ! -e /opt/train/requirements/new.txt\n")
    build = run_cli(["image", "build", str(repo / "containers" / "nest.def"), "--engine",
                     "docker", "--tag", "train/nest:ci", "--localimage",
                     f"base.sif={ci_image}"], env=docker_engine, timeout=600)
    assert build.returncode == 0, build.stderr
    try:
        code, out = _docker("train/nest:ci", ["/.train/test"], entrypoint=["/bin/sh"])
        assert code == 0, out
    finally:
        import docker

        docker.from_env().images.remove("train/nest:ci", force=True)


@pytest.mark.docker
def test_a_failing_test_section_fails_the_build_as_in_apptainer(
        ci_image: str, docker_engine: dict[str, str], tmp_path: Path) -> None:
    """`apptainer build` runs %test last and fails when it fails; so does the Docker build,
    which then keeps no image under the tag."""
    import docker

    repo = tmp_path / "repo"
    (repo / "containers").mkdir(parents=True)
    (repo / "pyproject.toml").write_text("")
    (repo / "containers" / "failing.def").write_text(
        "Bootstrap: localimage\nFrom: base.sif\n\n%post\n    touch /opt/built\n\n"
        "%test\n    set -e\n    test -f /opt/built\n    test -f /opt/never-made\n"
        "    true\n")
    build = run_cli(["image", "build", str(repo / "containers" / "failing.def"), "--engine",
                     "docker", "--tag", "train/failing:ci", "--localimage",
                     f"base.sif={ci_image}"], env=docker_engine, timeout=600)
    assert build.returncode != 0, build.stdout
    assert "its %test failed" in build.stderr and "Traceback" not in build.stderr
    with pytest.raises(docker.errors.ImageNotFound):
        docker.from_env().images.get("train/failing:ci")


@pytest.mark.docker
def test_sc2_builds_reproducibly_from_any_directory_and_prints_its_content_digest(
        sc2_image: str, docker_engine: dict[str, str], tmp_path: Path) -> None:
    """A second build without the engine's cache, started from another directory, holds the
    same files (path, mode, sha256) as the first; `train image digest` shows it."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    args = sc2_build_args()
    rebuild = run_cli(["image", "build", "sc2", "--engine", "docker", "--tag",
                       "train/sc2:again", "--no-cache", "--out", "sc2.build.json", *args],
                      env=docker_engine, timeout=1800, cwd=elsewhere)
    assert rebuild.returncode == 0, rebuild.stderr
    # every download's sum printed (without -v) and recorded beside the build
    sums = dict(a.split("=", 1) for a in args if a.startswith(("SC2_SHA256=", "MAPS_SHA256=")))
    assert "downloaded: 2 file(s)" in rebuild.stdout, rebuild.stdout
    assert f"{sums['SC2_SHA256']}  sc2.zip  file:///opt/train/downloads/SC2.4.10.zip  " \
        "verified (SC2_SHA256)" in rebuild.stdout
    assert f"{sums['MAPS_SHA256']}  mini_games.zip" in rebuild.stdout
    record = json.loads((elsewhere / "sc2.build.json").read_text())
    assert {(x["name"], x["sha256"], x["verified"]) for x in record["downloads"]} == {
        ("sc2.zip", sums["SC2_SHA256"], True), ("mini_games.zip", sums["MAPS_SHA256"], True)}
    assert "containers/requirements/sc2.txt" in record["locks"]
    assert record["image_digest"].startswith("sha256:")
    try:
        first = run_cli(["image", "digest", "sc2", "--engine", "docker", "--tag", sc2_image,
                         "--out", "first.txt"], env=docker_engine, timeout=900, cwd=elsewhere)
        second = run_cli(["image", "digest", "sc2", "--engine", "docker", "--tag",
                          "train/sc2:again", "--out", "second.txt"], env=docker_engine,
                         timeout=900, cwd=elsewhere)
        assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
        listing = (elsewhere / "first.txt").read_text().splitlines()
        assert any(line.endswith(" /opt/sc2/StarCraftII/Maps/mini_games/MoveToBeacon.SC2Map")
                   for line in listing)
        assert any("/pysc2/lib/__pycache__/colors.cpython-" in line for line in listing)
        differ = sorted(set(listing) ^ set((elsewhere / "second.txt").read_text().splitlines()))
        assert differ == []
        assert first.stdout.split()[0] == second.stdout.split()[0]
        assert first.stdout.startswith("sha256:")
    finally:
        import docker

        docker.from_env().images.remove("train/sc2:again", force=True)


def _layer_files(tag: str) -> list[tuple[int, list[str]]]:
    """(size, file names) of each layer of a docker image, from `docker save`."""
    import io
    import tarfile

    import docker

    raw = b"".join(docker.from_env().images.get(tag).save())
    layers = []
    with tarfile.open(fileobj=io.BytesIO(raw)) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
        for name in manifest[0]["Layers"]:
            member = outer.getmember(name)
            with tarfile.open(fileobj=outer.extractfile(member)) as layer:
                layers.append((member.size, [n[2:] if n.startswith("./") else n
                                             for n in layer.getnames()]))
    return layers


@pytest.mark.docker
def test_downloads_and_staged_files_stay_in_no_layer(sc2_image: str, ci_image: str,
                                                     docker_engine: dict[str, str],
                                                     tmp_path: Path) -> None:
    """What %files staged and %post removed (the stand-in game, maps and the lock's wheels
    from DOWNLOADS) is in no layer of the image: the build adds one layer to the base's.
    Docker's own builder, given the translated Dockerfile, keeps them (the COPY layer and
    the %files copy): the check below sees them there."""
    import docker

    staged = ("opt/train/downloads/", ".train/files/", ".train/build/")
    base = _layer_files(ci_image)
    layers = _layer_files(sc2_image)
    added = [size for size, _ in layers[len(base):]]
    assert len(layers) == len(base) + 1
    for _, names in layers:
        assert not [n for n in names if n.startswith(staged)]
    # the lock's wheels (DOWNLOADS) were installed, not kept
    assert not [n for n in layers[-1][1] if n.endswith(".whl")]
    context = tmp_path / "context"
    translate = run_cli(["image", "translate", "sc2", "--out", str(context),
                         *sc2_build_args()], env=docker_engine)
    assert translate.returncode == 0, translate.stderr
    docker.from_env().images.build(path=str(context), tag="train/sc2:dockerfile",
                                   network_mode="none", rm=True)
    try:
        old = _layer_files("train/sc2:dockerfile")[len(base):]
        dead = [size for size, names in old if [n for n in names if n.startswith(staged)]]
        print(f"sc2 on the CI base: train image build adds {added} bytes in one layer; "
              f"Docker's builder adds {[size for size, _ in old]}, of which {dead} hold "
              "staged downloads")
        assert dead
    finally:
        docker.from_env().images.remove("train/sc2:dockerfile", force=True)


@pytest.mark.docker
def test_build_refuses_a_missing_stand_in_before_the_engine_starts(tmp_path: Path) -> None:
    args = sc2_build_args()
    args[args.index(next(a for a in args if a.startswith("MAPS_URL=")))] = (
        "MAPS_URL=file:///opt/train/downloads/not-there.zip")
    proc = run_cli(["image", "build", "sc2", "--engine", "docker", *args],
                   env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert proc.returncode == 2, proc.stderr
    assert "build-arg MAPS_URL: file:///opt/train/downloads/not-there.zip is missing" in \
        proc.stderr
    # CI's stand-ins live where a cluster build from the same clone never looks
    assert str(REPO / ".nox" / "sc2-standins" / "not-there.zip") in proc.stderr
