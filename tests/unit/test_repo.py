"""The README's promises: two command lines first, the second is what CI runs; a front door
under 150 lines; and every documented command (README and docs/) still parses and runs."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

# every page whose commands are held by these tests (README first)
DOC_FILES = ("README.md", "docs/sites.md", "docs/your-program.md", "docs/images.md",
             "docs/sweeps.md", "docs/doctor.md", "docs/demo.md", "docs/developing.md",
             "docs/newcomer-jobs.md")


def doc_texts() -> dict[str, str]:
    return {name: (REPO / name).read_text() for name in DOC_FILES}


def _command_lines() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_opens_with_exactly_two_command_lines() -> None:
    text = (REPO / "README.md").read_text()
    first_block = text.index("```bash")
    assert text[:first_block].count("\n") <= 3  # only the title comes before them
    lines = _command_lines()
    assert len(lines) == 2
    assert "demo" in lines[0]
    assert "tests" in lines[1]


def test_ci_runs_the_readme_test_line() -> None:
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert _command_lines()[1] in ci


def test_constraints_pin_cpu_torch_and_package_asks_a_range() -> None:
    constraints = (REPO / "ci" / "constraints.txt").read_text()
    assert re.search(r"^torch==\d+\.\d+\.\d+$", constraints, re.M)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'"torch>=[\d.]+,<\d+"', pyproject)


def readme_recipes() -> list[list[str]]:
    """The documented `train submit` recipes with {newest:GLOB} resume arguments, as argv."""
    import shlex

    return [shlex.split(line.strip())[1:] for text in doc_texts().values()
            for line in text.splitlines()
            if line.strip().startswith("train submit") and "{newest:" in line]


def test_the_readmes_resume_recipes_render_as_written(tmp_path: Path) -> None:
    import sys

    from tests.conftest import run_cli
    from tests.golden.cases import script_array

    recipes = readme_recipes()
    assert len(recipes) == 2  # the Trainer's and Lightning's
    for argv in recipes:
        assert argv[0] == "submit"
        cut = argv.index("--")
        (tmp_path / argv[cut + 2]).write_text("")  # the program's script
        argv[argv.index("-t") + 1] = "30"  # (the local cluster's partition: an hour)
        proc = run_cli(["render", "--name", "r", "--cluster", "local", "--runtime", "none",
                        "--python", sys.executable, *argv[1:]], cwd=tmp_path)
        assert proc.returncode == 0, (argv, proc.stderr)
        resume = script_array(proc.stdout, "RESUME_ARGS")
        assert any("{newest:" in word for word in resume), resume


def test_the_readme_is_a_front_door_and_links_every_page() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    for name in (*DOC_FILES[1:], "docs/ARCHITECTURE.md"):
        assert f"]({name})" in text, name
        assert (REPO / name).is_file(), name


def documented_commands() -> list[tuple[str, list[str]]]:
    """Every `train ...` command line of the bash blocks of the README and docs/ (continued
    lines joined; comments, `[optional]` brackets and `...` placeholders taken out), and
    every table cell that is one whole job command (`train submit|render ...`), as (page,
    argv after `train`)."""
    import shlex

    found = []
    for name, text in doc_texts().items():
        for row in (line for line in text.splitlines() if line.startswith("|")):
            for cell in re.findall(r"\|\s*`(train (?:submit|render) [^`]+)`\s*(?=\|)", row):
                found.append((name, shlex.split(cell)[1:]))
        for block in re.findall(r"```bash\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                line = re.sub(r"\s+#.*$", "", line).strip()
                if not line.startswith("train "):
                    continue
                line = re.sub(r"\[([^\]]*)\]", r"\1", line).replace("...", "")
                found.append((name, shlex.split(line)[1:]))
    return found


def test_every_documented_train_command_parses() -> None:
    """A renamed or removed flag breaks its documentation here, not at a user's login node."""
    from train.cli import build_parser

    commands = documented_commands()
    pages = {name for name, _ in commands}
    assert {"README.md", "docs/sites.md", "docs/your-program.md", "docs/images.md",
            "docs/doctor.md", "docs/demo.md", "docs/newcomer-jobs.md"} <= pages, pages
    for name, argv in commands:
        words = argv[:argv.index("--")] if "--" in argv else argv
        if "--resume-args" in words:  # as `train` joins it (a value that is a flag)
            at = words.index("--resume-args")
            words = [*words[:at], f"--resume-args={words[at + 1]}", *words[at + 2:]]
        try:
            build_parser().parse_args(words)
        except SystemExit as exc:
            raise AssertionError(f"{name}: train {shlex_join(argv)}") from exc


def shlex_join(argv: list[str]) -> str:
    import shlex

    return shlex.join(argv)


def test_the_readmes_site_recipes_render(tmp_path: Path) -> None:
    """Each site's `train init` + `train submit` of the README, rendered (render checks what
    submit checks, warning where submit refuses: the image is not on this machine). Run as
    the installed `train` is: `python -m train` would run the folder's own train.py."""
    import os
    import subprocess
    import sys

    def run_cli(args: list[str], env: dict[str, str], cwd: Path
                ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-P", "-m", "train", *args], cwd=cwd,
                              env={**os.environ, **env}, capture_output=True, text=True,
                              timeout=180, check=False)

    text = (REPO / "README.md").read_text()
    section = text[text.index("## Your own script on each site"):
                   text.index("## The walltime contract")]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 3
    (tmp_path / "train.py").write_text("")
    for block in blocks:
        lines = [line.split() for line in block.splitlines() if line.strip()]
        assert len(lines) <= 5
        env = {"TRAIN_DEFAULTS": str(tmp_path / f"{len(lines)}-{lines[0][3]}.yaml")}
        init = run_cli(lines[0][1:], env=env, cwd=tmp_path)
        assert init.returncode == 0, (lines[0], init.stderr)
        submit = next(words for words in lines if words[1] == "submit")
        proc = run_cli(["render", *submit[2:]], env=env, cwd=tmp_path)
        assert proc.returncode == 0, (submit, proc.stderr)
        assert "#SBATCH" in proc.stdout
