"""The chain engine's interpreter, checked at submit (checks.python): the python3 the job's
PATH finds runs the engine on the batch host; none, or one older than 3.6, is refused with
the fix, before anything is queued."""

from __future__ import annotations

from pathlib import Path

from tests.unit.engine_python import ENGINE_PYTHON
from train.client.clusters.profiles import Registry
from train.client.slurm.checks.python import engine_problems
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.resolve import resolve


def _job(modules: tuple[str, ...] = ()) -> object:
    job = resolve(JobSpec(cluster="local", name="e", cpus_per_task=1, mem="1000M",
                          runtime="none", workload=("demo",)), Registry(environ={}).get("local"))
    if modules:
        import dataclasses

        job = dataclasses.replace(job, profile=dataclasses.replace(job.profile,
                                                                   modules=modules))
    return job


def _bin(tmp_path: Path, script: str | None) -> str:
    folder = tmp_path / "bin"
    folder.mkdir()
    if script is not None:
        (folder / "python3").write_text(script)
        (folder / "python3").chmod(0o755)
    return str(folder)


def test_no_python3_on_the_path_is_refused_with_the_fix(tmp_path: Path) -> None:
    problems, _ = engine_problems(_job(), {"PATH": _bin(tmp_path, None)})  # type: ignore[arg-type]
    assert [p.field for p in problems] == ["python"]
    assert "no python3 on this PATH" in problems[0].text
    assert "module load python" in problems[0].text


def test_a_site_set_up_may_bring_it_said_as_a_note(tmp_path: Path) -> None:
    problems, notes = engine_problems(_job(("module load python",)),  # type: ignore[arg-type]
                                      {"PATH": _bin(tmp_path, None)})
    assert problems == [] and "cluster profile's set-up" in notes[0]


def test_a_python3_older_than_36_is_refused(tmp_path: Path) -> None:
    old = _bin(tmp_path, "#!/bin/sh\necho 3 4\n")  # what a 3.4 prints for the check
    problems, _ = engine_problems(_job(), {"PATH": old})  # type: ignore[arg-type]
    assert "is Python 3.4" in problems[0].text and "3.6 or newer" in problems[0].text


def test_the_oldest_python_here_is_accepted(tmp_path: Path) -> None:
    folder = _bin(tmp_path, f'#!/bin/sh\nexec {ENGINE_PYTHON} "$@"\n')
    problems, notes = engine_problems(_job(), {"PATH": folder})  # type: ignore[arg-type]
    assert problems == [] and notes == []
