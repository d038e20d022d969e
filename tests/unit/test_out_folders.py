"""--out where a chain or a sweep would put its files among the user's (issue 38, tried
again as a hostile user): a file, a sweep's folder that holds the user's files; and the
fix text for a braced ${TRAIN_SWEEP_VALUE}."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_cli

LOCAL = ["-M", "local", "-t", "30", "-e", "command"]


def test_an_out_that_is_a_file_is_refused_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "fit.py").write_text("")
    proc = run_cli(["render", *LOCAL, "--out", "fit.py", "--", "python", "fit.py"],
                   cwd=tmp_path)
    assert "Traceback" not in proc.stderr
    assert "out: --out fit.py:" in proc.stderr and "is not a folder" in proc.stderr


def test_a_sweeps_out_that_holds_the_users_files_is_refused_once(tmp_path: Path) -> None:
    (tmp_path / "fit.py").write_text("")
    mine = tmp_path / "o5"
    (mine / "jobs").mkdir(parents=True)
    (mine / "jobs" / "array.sbatch").write_text("mine\n")
    argv = ["render", *LOCAL, "--out", "o5", "--sweep-seeds", "1 2", "--", "python",
            "fit.py", "--seed", "{value}", "--o", "{task_dir}"]
    proc = run_cli(argv, cwd=tmp_path)
    said = [ln for ln in proc.stderr.splitlines() if "the sweep's folder holds files" in ln]
    assert len(said) == 1 and f"--out {mine}" in said[0], proc.stderr
    assert (mine / "jobs" / "array.sbatch").read_text() == "mine\n"
    # a sweep's own folder (its record there) is no user's
    (tmp_path / "o6").mkdir()
    (tmp_path / "o6" / "sweep.json").write_text("{}")
    proc = run_cli([*argv[:argv.index("o5")], "o6", *argv[argv.index("o5") + 1:]],
                   cwd=tmp_path)
    assert "the sweep's folder holds files" not in proc.stderr


def test_a_braced_sweep_variable_gets_the_fix_without_a_stray_brace(tmp_path: Path) -> None:
    (tmp_path / "fit.py").write_text("")
    proc = run_cli(["render", *LOCAL, "-J", "sw", "--sweep", "lr=1,2", "--", "python",
                    "fit.py", "--lr", "${TRAIN_SWEEP_VALUE}"], cwd=tmp_path)
    assert proc.returncode == 2 and "e.g. '{value}';" in proc.stderr, proc.stderr


def test_a_sweeps_out_that_holds_the_users_results_csv_or_model_folder_is_refused(
        tmp_path: Path) -> None:
    """A results.csv of the user's (the seeds would append their rows to it) and a model's
    folder holding its config.json passed as the sweep's own; a seed's folder run by hand,
    and the results.csv beside it, still do."""
    (tmp_path / "fit.py").write_text("")
    mine = tmp_path / "proj"
    (mine / "bert").mkdir(parents=True)
    (mine / "bert" / "config.json").write_text("{}")
    (mine / "results.csv").write_text("my,results\n")
    argv = ["render", *LOCAL, "--out", "proj", "--sweep-seeds", "1 2", "--", "python",
            "fit.py", "--seed", "{value}", "--o", "{task_dir}"]
    proc = run_cli(argv, cwd=tmp_path)
    assert "the sweep's folder holds files (bert, results.csv)" in proc.stderr, proc.stderr
    (mine / "bert").rename(mine / "seed-1")  # a seed run by hand: its results.csv beside
    proc = run_cli(argv, cwd=tmp_path)
    assert "the sweep's folder holds files" not in proc.stderr, proc.stderr
