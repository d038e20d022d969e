"""Image definitions: lint rules, the .def -> Dockerfile translator, lock files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.golden.images_cases import CASES, golden_path, rendered
from train.common.errors import UsageError
from train.images.defs import DefError, containers_dir, parse
from train.images.dockerfile import translate
from train.images.lint import lint_all, lint_def, lock_problems

GOOD = """\
Bootstrap: docker
From: {{ BASE }}

%arguments
    BASE=debian:12.5
    LOCK=ok.txt

%files
    src /opt/src
    README.md

%post
    export GREETING="hello world"
    echo "$GREETING" > /greeting
    pip install --require-hashes --no-deps -r /opt/req/{{ LOCK }}
    pip install --no-index --no-deps /opt/src

%environment
    export PATH=/opt/venv/bin:$PATH
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,garbage_collection_threshold:0.7,max_split_size_mb:128
    LANG=C.UTF-8

%runscript
    exec python -m train "$@"

%test
    test -f /greeting

%labels
    org.example.version 1.2.3
    org.example.base {{ BASE }}

%help
    Help text.
"""


def _write(tmp_path: Path, text: str, lock: str = "a==1 \\\n    --hash=sha256:00\n") -> Path:
    """A repository in tmp_path: containers/image.def, its lock, the %files sources."""
    defs = tmp_path / "containers"
    (defs / "requirements").mkdir(parents=True, exist_ok=True)
    (defs / "requirements" / "ok.txt").write_text(lock)
    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "README.md").write_text("readme\n")
    (tmp_path / "pyproject.toml").write_text("")  # a source tree: %files sources are checked
    path = defs / "image.def"
    path.write_text(text)
    return path


def test_shipped_definitions_pass_lint() -> None:
    paths = sorted(containers_dir().glob("*.def"))
    assert {p.stem for p in paths} == {"base", "sc2", "navsim"}
    assert lint_all(paths) == []


@pytest.mark.parametrize("case", sorted(CASES))
def test_translation_matches_golden(case: str) -> None:
    # regenerate after an intended change: python -m tests.golden.images_cases
    assert rendered(case) == golden_path(case).read_text(encoding="utf-8")


def test_good_definition_is_clean(tmp_path: Path) -> None:
    assert lint_def(_write(tmp_path, GOOD)) == []


@pytest.mark.parametrize(("old", "new", "rule", "line"), [
    ("BASE=debian:12.5", "BASE=debian:latest", "pinned-base", 2),
    ("BASE=debian:12.5", "BASE=debian:12", "pinned-base", 2),
    ("BASE=debian:12.5", "BASE=debian", "pinned-base", 2),
    ("pip install --require-hashes --no-deps -r /opt/req/{{ LOCK }}",
     "pip install numpy", "pip-lock", 15),
    ("LOCK=ok.txt", "LOCK=missing.txt", "pip-lock", 15),
    ("max_split_size_mb:128", "max_split_size_mb:64", "alloc-env", 18),
    ('exec python -m train "$@"', "exec python -m train", "runscript-args", 23),
    ("%help\n    Help text.\n", "", "section-help", 1),
    ("%labels\n", "%labelz\n", "section", 29),
])
def test_each_rule_catches_a_broken_definition(tmp_path: Path, old: str, new: str,
                                               rule: str, line: int) -> None:
    assert old in GOOD
    violations = lint_def(_write(tmp_path, GOOD.replace(old, new)))
    assert [(v.rule, v.line) for v in violations] == [(rule, line)], violations
    text = str(violations[0])
    assert text.startswith(f"{tmp_path / 'containers' / 'image.def'}:{line}: [{rule}]")


def test_lock_without_hash_is_named(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD, lock="a==1 \\\n    --hash=sha256:00\nb==2\n")
    violations = lint_def(path)
    assert [v.rule for v in violations] == ["pip-lock"]
    assert "without --hash: b==2" in violations[0].message


def test_shipped_locks_are_fully_hashed() -> None:
    locks = sorted(p for p in (containers_dir() / "requirements").glob("*.txt")
                   if not p.name.endswith("-imports.txt"))  # a module list, not a lock
    assert {p.name for p in locks} >= {"base-cpu.txt", "base-cu130.txt", "sc2.txt"}
    for lock in locks:
        assert lock_problems(lock) == [], lock
    assert "enum34" not in (containers_dir() / "requirements" / "sc2.txt").read_text()


def test_translator_covers_every_section(tmp_path: Path) -> None:
    t = translate(parse(_write(tmp_path, GOOD)), {"BASE": "debian:12.6"})
    lines = t.dockerfile.splitlines()
    assert "FROM debian:12.6" in lines
    # %files as Apptainer copies them: staged, then `cp -fLr` after making DST's parent
    assert 'COPY ["files/0/src", "/.train/files/0/src"]' in lines
    assert 'COPY ["files/1/README.md", "/.train/files/1/README.md"]' in lines
    assert t.scripts["files"] == ("set -e\ncd /\nmkdir -p /opt\n"
                                  "cp -fLr /.train/files/0/src /opt/src\n"
                                  "mkdir -p /\ncp -fLr /.train/files/1/README.md /README.md\n"
                                  "rm -rf /.train/files\n")
    assert lines.index('RUN ["/bin/sh", "-e", "/.train/build/files"]') < lines.index(
        'RUN ["/bin/sh", "-e", "/.train/build/post"]')  # %files before %post
    assert lines.index('RUN ["/bin/sh", "-e", "/.train/build/post"]') < lines.index(
        "ENV PATH=/opt/venv/bin:$PATH")  # %environment applies at run time, after %post
    assert "ENV LANG=C.UTF-8" in lines
    assert 'LABEL "org.example.base"="debian:12.6"' in lines
    assert lines[-1] == 'ENTRYPOINT ["/bin/sh", "/.train/runscript"]'
    post = t.scripts["post"]
    assert post.startswith("set -e\ncd /\n") and "-r /opt/req/ok.txt" in post
    assert 'export GREETING="hello world"\necho "$GREETING"' in post  # one script
    assert t.scripts["test"] == "#!/bin/sh\ntest -f /greeting\n"
    assert t.scripts["help"] == "Help text.\n"
    assert t.scripts["runscript"].endswith('exec python -m train "$@"\n')


def test_translated_post_keeps_exports_when_run(tmp_path: Path) -> None:
    t = translate(parse(_write(tmp_path, GOOD.replace("> /greeting", "> greeting").replace(
        "    pip install --require-hashes --no-deps -r /opt/req/{{ LOCK }}\n", "").replace(
        "    pip install --no-index --no-deps /opt/src\n", ""))))
    script = tmp_path / "post"
    # the script starts in / as Apptainer's %post does; here, in tmp_path
    script.write_text(t.scripts["post"].replace("set -e\ncd /\n", "set -e\n", 1))
    subprocess.run(["/bin/sh", "-e", str(script)], cwd=tmp_path, check=True)
    assert (tmp_path / "greeting").read_text() == "hello world\n"


@pytest.mark.parametrize(("old", "new", "match"), [
    ("%files\n", "%setup\n    touch /x\n\n%files\n", "%setup cannot be translated"),
    ("LANG=C.UTF-8", "if true; then export X=1; fi", "cannot become ENV"),
    ("{{ BASE }}\n\n%arguments", "{{ OTHER }}\n\n%arguments", "OTHER }} is not declared"),
    ("Bootstrap: docker", "Bootstrap: library", "Bootstrap: library cannot be translated"),
])
def test_untranslatable_is_an_error_never_dropped(tmp_path: Path, old: str, new: str,
                                                  match: str) -> None:
    with pytest.raises(DefError, match=match):
        translate(parse(_write(tmp_path, GOOD.replace(old, new))))


def test_build_args_and_localimages(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"build-arg NOPE: image\.def has no such argument"):
        translate(parse(_write(tmp_path, GOOD)), {"NOPE": "1"})
    sc2 = parse(containers_dir() / "sc2.def")
    with pytest.raises(DefError, match=r"--localimage base\.sif=TAG"):
        translate(sc2)
    assert translate(sc2, {}, {"base.sif": "t:1"}).dockerfile.splitlines()[2] == "FROM t:1"


def _sc2_fetch() -> str:
    """sc2.def's own fetch() function, as its %post defines it."""
    post = parse(containers_dir(None) / "sc2.def").sections["post"].text
    start = post.index("fetch() {")
    return post[start:post.index("\n}\n", start) + 3]


def test_sc2_download_prints_its_sha256_on_a_line_the_build_reads(tmp_path: Path) -> None:
    """The real definition's download step: the file's sum on a `train-download:` line
    (which both engines' build output is read for), and a failed download stops %post."""
    import hashlib

    from train.images.build import BuildLog

    (tmp_path / "maps.zip").write_bytes(b"maps" * 1000)
    script = (_sc2_fetch() + f"cd {tmp_path}\n"
              f"fetch file://{tmp_path}/maps.zip got.zip MAPS_SHA256\n"
              f"fetch file://{tmp_path}/absent.zip gone.zip SC2_SHA256\necho not reached\n")
    proc = subprocess.run(["/bin/sh", "-e", "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode != 0 and "not reached" not in proc.stdout
    build_log = BuildLog(show=lambda line: None)
    build_log.feed(proc.stdout)
    (download,) = build_log.downloads
    assert download.sha256 == hashlib.sha256(b"maps" * 1000).hexdigest()
    assert (download.name, download.argument) == ("got.zip", "MAPS_SHA256")
    assert download.url == f"file://{tmp_path}/maps.zip"


FAKE_APPTAINER = """#!/bin/sh
# stand-in for `apptainer build ... SIF DEF`: what a real build prints, then the SIF
for last; do :; done
eval "sif=\\${$(($# - 1))}"
echo "INFO:    Starting build..."
echo "downloading sc2.zip: 512 MiB after 30 s"
echo "train-download: %s sc2.zip http://example.invalid/SC2.4.10.zip SC2_SHA256"
echo "train-download: %s mini_games.zip https://example.invalid/mini_games.zip MAPS_SHA256"
echo "INFO:    Build complete: $sif"
printf 'sif bytes' > "$sif"
"""


def test_apptainer_build_shows_every_sum_and_writes_the_build_record(tmp_path: Path) -> None:
    """Without -v: each download's sum at the end, the exact --build-arg for the maps sum
    still to record, progress lines as they come; the record beside the SIF holds them,
    the lock's sum and the SIF's digest. (apptainer is a stand-in: it cannot be installed
    here; the lines it prints are those sc2.def's %post prints, tested above.)"""
    import hashlib
    import json
    import os

    from tests.conftest import REPO, run_cli

    game, maps = "a" * 64, "b" * 64
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apptainer"
    fake.write_text(FAKE_APPTAINER % (game, maps))
    fake.chmod(0o755)
    sif = tmp_path / "sc2.sif"
    proc = run_cli(["image", "build", "sc2", "--engine", "apptainer", "--out", str(sif)],
                   env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    assert f"{game}  sc2.zip  http://example.invalid/SC2.4.10.zip  verified (SC2_SHA256)" \
        in proc.stdout
    assert f"{maps}  mini_games.zip" in proc.stdout
    assert "NOT VERIFIED (MAPS_SHA256=record-on-first-build)" in proc.stdout
    assert f"next time pass: --build-arg MAPS_SHA256={maps}" in proc.stdout
    assert "downloading sc2.zip: 512 MiB after 30 s" in proc.stderr
    record = json.loads((tmp_path / "sc2.build.json").read_text())
    assert record["image_digest"] == "sha256:" + hashlib.sha256(b"sif bytes").hexdigest()
    assert [(d["name"], d["sha256"], d["verified"]) for d in record["downloads"]] == [
        ("sc2.zip", game, True), ("mini_games.zip", maps, False)]
    lock = REPO / "containers" / "requirements" / "sc2.txt"
    assert record["locks"] == {"containers/requirements/sc2.txt":
                               hashlib.sha256(lock.read_bytes()).hexdigest()}
    assert record["build_args"]["MAPS_SHA256"] == "record-on-first-build"


def test_apptainer_build_failure_shows_the_builds_last_lines(tmp_path: Path) -> None:
    import os

    from tests.conftest import run_cli

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apptainer"
    fake.write_text("#!/bin/sh\necho 'curl: (6) Could not resolve host'\nexit 255\n")
    fake.chmod(0o755)
    sif = tmp_path / "sc2.sif"
    proc = run_cli(["image", "build", "sc2", "--engine", "apptainer", "--out", str(sif)],
                   env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert proc.returncode != 0
    assert "apptainer build of sc2 exited with 255" in proc.stderr
    assert "Could not resolve host" in proc.stderr
    assert not (tmp_path / "sc2.build.json").exists()


def test_network_is_checked_before_any_engine_starts(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    proc = run_cli(["image", "build", "base", "--engine", "docker", "--network", "bridge"])
    assert proc.returncode == 2
    assert "--network" in proc.stderr and "none" in proc.stderr
    proc = run_cli(["image", "build", "base", "--engine", "apptainer", "--network", "none",
                    "--out", str(tmp_path / "b.sif")])
    assert proc.returncode == 2
    assert "apptainer builds use the host's network" in proc.stderr


def test_docker_build_stages_files_and_scripts_as_the_translation_places_them(
        tmp_path: Path) -> None:
    """The tar the build container gets: %files sources under /.train/files (where the
    translated `files` script copies them from), the scripts `all` runs, and `all` removes
    what was staged in the same step, so no layer keeps it."""
    import tarfile

    from train.images.dockerengine import _stage, write_context

    repo = tmp_path / "repo"
    (repo / "containers" / "dl").mkdir(parents=True)
    (repo / "pyproject.toml").write_text("")
    (repo / "containers" / "dl" / "game.zip").write_bytes(b"zip")
    (repo / "containers" / "x.def").write_text(
        "Bootstrap: docker\nFrom: debian:12.5\n\n%files\n    containers/dl /opt/dl\n\n"
        "%post\n    rm -rf /opt/dl\n\n%runscript\n    exec true \"$@\"\n")
    d = parse(repo / "containers" / "x.def")
    ctx = write_context(d, tmp_path / "ctx", {}, {}, repo)
    archive = tmp_path / "staged.tar"
    _stage(ctx, translate(d).scripts, archive)
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        run_all = tar.extractfile(".train/build/all").read().decode()  # type: ignore[union-attr]
    assert ".train/files/0/dl/game.zip" in names
    assert {".train/build/files", ".train/build/post", ".train/runscript"} <= names
    assert run_all.splitlines() == ["set -e", "/bin/sh -e /.train/build/files",
                                    "/bin/sh -e /.train/build/post",
                                    "rm -rf /.train/build /.train/files"]


def test_docker_build_config_fills_in_environment_variables_as_docker_env_does() -> None:
    """A commit keeps `ENV PATH=/opt/venv/bin:$PATH` as text (then nothing is found on
    PATH): the values are filled in from the base image's environment first."""
    from types import SimpleNamespace

    from train.images.dockerengine import DEFAULT_PATH, _config

    d = parse(containers_dir(None) / "base.def")
    translation = translate(d)
    image = SimpleNamespace(attrs={"Config": {"Env": None, "Entrypoint": None,
                                              "Cmd": ["bash"]}})
    client = SimpleNamespace(images=SimpleNamespace(get=lambda tag: image))
    changes = _config(translation, client, "base")
    assert f"ENV PATH=/opt/venv/bin:{DEFAULT_PATH}" in changes
    assert 'ENTRYPOINT ["/bin/sh", "/.train/runscript"]' in changes
    assert changes[-1] == "CMD []"
    assert any(c.startswith('LABEL "org.train.image"="base"') for c in changes)
