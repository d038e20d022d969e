"""The rendered-script golden cases. Regenerate the files after an intended change with:

    python -m tests.golden.cases

then review the diff (`git diff tests/golden`) before committing.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

from train.client.clusters.profiles import Registry
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.render import render
from train.client.slurm.resolve import ResolvedJob, resolve

HERE = Path(__file__).parent
RUN_ROOT = "/scratch/user/runs"

CASES: dict[str, dict[str, Any]] = {
    # seed 000's E1 job, its conda environment's interpreter called directly
    "gilbreth-chunked": dict(cluster="gilbreth", name="e1", account="lab", partition="a30",
                             qos="standby", time="2:00:00", gpus_per_node=1, max_chunks=3,
                             mem="50G", python="/depot/lab/envs/gpu/bin/python", workload=("demo", "--res", "32", "--seeds", "4",
                                                  "--episodes", "9000")),
    "gilbreth-multinode": dict(cluster="gilbreth", name="mn", account="lab",
                               partition="a100-40gb", time="12:00:00", nodes=2,
                               gpus_per_node=4, cpus_per_task=16, runtime="apptainer",
                               image="/depot/lab/train-base.sif",
                               workload=("demo", "--episodes", "20000", "--results-csv",
                                         "/depot/lab/r $(id); `id` 'q' \"d\"\n.csv")),
    "rivanna-chunked": dict(cluster="rivanna", name="r1", account="grp", gpus_per_node=1,
                            gpu_type="a100", max_chunks=2, runtime="none",
                            python="/scratch/grp/venv/bin/python",
                            workload=("demo", "--res", "32")),
    # a DDP script under torch's launcher with every default: the runtime from the image,
    # the node's one task given 4 CPUs per GPU and those CPUs' memory (two whole nodes:
    # Rivanna's multi-node jobs take all 8 GPUs of each)
    "rivanna-torchrun-defaults": dict(cluster="rivanna", name="rt", account="grp", nodes=2,
                                      gpus_per_node=8, gpu_type="a100", entry="command",
                                      image="/scratch/grp/base.sif", stop_signal="USR1",
                                      workload=("python", "train.py")),
    "rivanna-multinode": dict(cluster="rivanna", name="rm", account="grp", nodes=2,
                              gpus_per_node=8, gpu_type="a100", cpus_per_task=8,
                              launch="tasks", time="1-00:00:00", runtime="apptainer",
                              image="/scratch/grp/navsim.sif", workers=2, worker_mem="8G",
                              workload=("demo",)),
    # the runtime follows the image (apptainer), one GPU of either type
    "torch-chunked": dict(cluster="torch", name="t1", account="torch_pr_1_general",
                          constraint="h200|l40s", gpus_per_node=1, max_chunks=4, preempt=True,
                          time="2:00:00", image="/scratch/me/train-base.sif",
                          workload=("demo", "--seeds", "4 6 8")),
    "torch-multinode": dict(cluster="torch", name="tm", account="torch_pr_1_general",
                            constraint="l40s", nodes=4, gpus_per_node=4, cpus_per_task=8,
                            launch="tasks", mem="200G", workers=2, worker_mem="4G",
                            runtime="apptainer", image="/scratch/me/navsim.sif",
                            workload=("demo",)),
    "torch-navsim": dict(cluster="torch", name="navsim16", account="torch_pr_1_general",
                         constraint="l40s", nodes=4, gpus_per_node=4, gpu_type="l40s",
                         cpus_per_task=8, mem="200G", workers=2, worker_mem="4G",
                         entry="navsim", runtime="apptainer", image="/scratch/me/navsim.sif",
                         time="1-00:00:00",
                         workload=("agent=transfuser_agent", "experiment_name=h16")),
    "local-chunked": dict(cluster="local", name="l1", max_chunks=3, time="5:00",
                          runtime="none", cpus_per_task=1, mem="1000M", signal_margin=30,
                          workload=("demo", "--episodes", "6")),
    "local-multinode": dict(cluster="local", name="lm", nodes=2, gpus_per_node=2,
                            cpus_per_task=2, mem="2000M", runtime="docker",
                            image="train-base:ci",
                            workload=("demo", "--episodes", "4", "--results-csv",
                                      RUN_ROOT + "/lm/r $(id); `id` 'q' \"d\"\n.csv")),
    "local-requeue": dict(cluster="local", name="lq", requeue=True, time="3:00", runtime="none",
                          signal_margin=60, time_budget=False, cpus_per_task=1,
                          mem="1000M", workload=("demo", "--results-csv",
                                                 "/tmp/x $(id); `id` 'q' \"d\"\nnl.csv")),
    # a researcher's own DDP script under torch's launcher, with the escape hatches
    "rivanna-ddp-script": dict(cluster="rivanna", name="ddp", account="grp", nodes=2,
                               gpus_per_node=8, gpu_type="a100", cpus_per_task=32,
                               entry="command", runtime="apptainer",
                               image="/scratch/grp/base.sif", stop_signal="USR1",
                               max_chunks=5, time="6:00:00",
                               env=("WANDB_API_KEY", "HF_HOME=/scratch/grp/hf cache"),
                               bind=("/usr/share:/data:ro",),
                               sbatch_extra=("--mail-type=END", "--exclude=udc-an28-[1-2]",
                                             "--comment=a b"),
                               srun_extra=("--mpi=none",),
                               workload=("python", "train.py", "--epochs", "90")),
    # one rank per task, all of each node's memory, no stop signal (one chunk)
    "local-tasks-command": dict(cluster="local", name="lt", nodes=2, gpus_per_node=2,
                                cpus_per_task=2, mem="0", entry="command", launch="tasks",
                                runtime="none",
                                workload=("bash", "-c", "echo $RANK of $WORLD_SIZE")),
}


def resolved(case: str) -> ResolvedJob:
    values = CASES[case]
    spec = JobSpec(**{"out": f"{RUN_ROOT}/{values['name']}", **values})
    return resolve(spec, Registry(environ={}).get(spec.cluster))


def rendered(case: str) -> str:
    # the submit folder (PROGRAM_DIR where a case has no --chdir) is the folder render
    # runs in: "/" here, so that a golden never holds the checkout's own path
    job = resolved(case)
    previous = os.getcwd()
    os.chdir("/")
    try:
        return render(job)
    finally:
        os.chdir(previous)


def script_array(text: str, name: str) -> list[str]:
    """A list a rendered script holds, as bash (or the engine) reads it: STEP, the step's
    argv (the script run with `module` a no-op and its last command printed instead of
    run, the part after the engine's `--`); RESUME_ARGS and SAVE_PATHS from the chain's
    settings lines."""
    if name != "STEP":
        label = {"RESUME_ARGS": "#   resume args: ", "SAVE_PATHS": "#   save paths: "}[name]
        found = [ln[len(label):] for ln in text.splitlines() if ln.startswith(label)]
        return shlex.split(found[0]) if found else []
    cut = text.rindex("\nexec ") + 1
    probe = ("module() { :; }\nml() { :; }\n" + text[:cut] + "printf '%s\\0' "
             + text[cut + len("exec "):])
    proc = subprocess.run(["bash", "-c", probe, "chain.sbatch", "1"], capture_output=True,
                          check=True, env={"PATH": os.environ["PATH"]}, timeout=60)
    argv = proc.stdout.decode("utf-8").split("\0")[:-1]
    return argv[argv.index("--") + 1:]


def script_step(text: str) -> list[str]:
    """The step's argv as bash makes it from a rendered script."""
    return script_array(text, "STEP")


def golden_path(case: str) -> Path:
    return HERE / f"{case}.sbatch"


if __name__ == "__main__":
    for name in CASES:
        golden_path(name).write_text(rendered(name), encoding="utf-8")
        print(f"wrote {golden_path(name)}")
