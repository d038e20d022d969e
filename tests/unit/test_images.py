"""Image definitions: lint rules, the .def -> Dockerfile translator, lock files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.golden.images_cases import CASES, golden_path, rendered
from train.errors import UsageError
from train.images.defs import DefError, parse
from train.images.dockerfile import translate
from train.images.lint import lint_all, lint_def, lock_problems
from train.images.sources import containers_dir

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
