"""NAVSIM's preset (split, workers without prefetch, script and strategy options) and the
navsim image's import list (the lock check of `nox -s navsim_lock` and the image's %test)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli, signals_while_ending, spawn_group
from train.client.clusters.profiles import Registry
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.navsim import NAVSIM_SCRIPT
from train.client.slurm.navsimstep import navsim_command
from train.client.slurm.render import step_argv
from train.client.slurm.resolve import resolve
from train.common.entry import module_argv
from train.common.errors import ConfigError
from train.workloads import navsim

ROOT = Path(__file__).resolve().parents[2]
REG = Registry(environ={})
NAVSIM = dict(cluster="local", cpus_per_task=1, mem="1000M", entry="navsim", runtime="none",
              workload=("agent=ego_status_mlp_agent",))


def _command(**kw: Any) -> list[str]:
    spec = JobSpec(**{**NAVSIM, **kw})
    return navsim_command(resolve(spec, REG.get("local")))


def _error(field: str, **kw: Any) -> str:
    with pytest.raises(ConfigError) as err:
        _command(**kw)
    assert err.value.field == field, str(err.value)
    return str(err.value)


def _keys(command: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in command[2:])


def test_the_split_is_always_passed_and_configurable() -> None:
    assert _keys(_command())["train_test_split"] == "navtrain"
    assert _keys(_command(navsim_split="navmini"))["train_test_split"] == "navmini"
    assert "--navsim-split" in _error("workload", workload=("train_test_split=mini",))


def test_no_workers_means_no_prefetch_factor() -> None:
    keys = _keys(_command())
    assert keys["dataloader.params.num_workers"] == "0"
    assert keys["dataloader.params.prefetch_factor"] == "null"
    keys = _keys(_command(workers=2, worker_mem="100M"))
    assert keys["dataloader.params.num_workers"] == "2"
    assert "dataloader.params.prefetch_factor" not in keys  # NAVSIM's own value stays


def test_the_training_script_is_an_option() -> None:
    assert _command()[1] == NAVSIM_SCRIPT
    fork = "/opt/fork/navsim/planning/script/run_training_dense.py"
    assert _command(navsim_script=fork)[1] == fork
    assert "absolute path" in _error("navsim_script", navsim_script="run_training.py")


def test_strategy_none_leaves_the_strategy_to_the_script() -> None:
    assert _keys(_command())["trainer.params.strategy"] == "ddp"
    command = _command(navsim_strategy="none")
    assert not any("strategy" in a for a in command)
    # the job's other trainer settings and the Lightning root stay
    assert _keys(command)["trainer.params.num_nodes"] == "1"
    assert "trainer.params.default_root_dir" in _keys(command)
    assert "--navsim-strategy none" in _error(
        "workload", workload=("trainer.params.strategy=ddp_find_unused_parameters_true",))
    own = _command(navsim_strategy="none", workload=("trainer.params.strategy=fsdp",))
    assert own[-1] == "trainer.params.strategy=fsdp"


def test_navsim_options_belong_to_entry_navsim() -> None:
    assert "--entry navsim" in _error("navsim_split", entry="train", workload=("demo",),
                                      navsim_split="navmini")
    assert "--entry navsim" in _error("navsim_strategy", entry="train", workload=("demo",),
                                      navsim_strategy="none")


@pytest.mark.parametrize(("flag", "value", "field"), [
    ("--navsim-split", "nav train", "navsim_split"),
    ("--navsim-split", "a=b", "navsim_split"),
    ("--navsim-script", "relative/run_training.py", "navsim_script"),
    ("--navsim-strategy", "fsdp", "navsim_strategy"),
])
def test_bad_values_exit_2_naming_the_field(flag: str, value: str, field: str) -> None:
    proc = run_cli(["render", "--cluster", "local", "--cpus-per-task", "1", "--mem", "1000M",
                    "--entry", "navsim", flag, value, "--"])
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr


def test_render_passes_the_options_through_the_cli() -> None:
    proc = run_cli(["render", "--cluster", "local", "--runtime", "none", "--cpus-per-task", "1",
                    "--mem", "1000M",
                    "--entry", "navsim", "--navsim-split", "navmini", "--navsim-strategy",
                    "none", "--navsim-script", "/opt/fork/run_training_dense.py", "--",
                    "agent=transfuser_agent"])
    assert proc.returncode == 0, proc.stderr
    assert "/opt/fork/run_training_dense.py" in proc.stdout
    assert "train_test_split=navmini" in proc.stdout
    assert "trainer.params.strategy" not in proc.stdout
    assert "dataloader.params.prefetch_factor=null" in proc.stdout


def _import_list() -> set[str]:
    text = (ROOT / "containers" / "requirements" / "navsim-imports.txt").read_text()
    return {line.split("#", 1)[0].strip() for line in text.splitlines()} - {""}


def _test_section_imports() -> set[str]:
    """The modules navsim.def's %test hands to importlib (the words after the -c code)."""
    text = (ROOT / "containers" / "navsim.def").read_text()
    section = re.search(r"(?ms)^%test\n(.*?)(?=^%)", text)
    assert section is not None
    joined = section.group(1).replace("\\\n", " ")
    line = next(ln for ln in joined.splitlines() if "importlib.import_module" in ln)
    return set(line.rsplit("'", 1)[1].split())


def test_the_import_list_covers_what_the_image_test_imports() -> None:
    listed, tested = _import_list(), _test_section_imports()
    ours = {"navsim", "nuplan", "train"}  # the devkits and this package: not from the lock
    assert tested - ours <= listed, f"%test imports what the lock check skips: {tested - ours - listed}"
    assert listed <= tested, f"the image test skips: {listed - tested}"


def test_the_import_list_holds_what_the_issue_found_missing() -> None:
    assert {"aioboto3", "boto3", "requests", "pytest", "pytorch_lightning",
            "pkg_resources"} <= _import_list()


# -- the feature cache: computed once per chain (train.workloads.navsim) ----------------

def test_the_command_caches_in_the_run_folder_unless_the_job_gives_a_folder() -> None:
    keys = _keys(_command())
    assert keys["cache_path"].endswith("/runs/train/navsim-cache")
    assert "force_cache_computation" not in keys  # chosen per chunk on the node
    own = _command(workload=("agent=ego_status_mlp_agent", "cache_path=/data/navsim/exp/c"))
    assert [a for a in own if a.startswith("cache_path=")] == ["cache_path=/data/navsim/exp/c"]


@pytest.mark.parametrize("arg", ["force_cache_computation=true",
                                 "+use_cache_without_dataset=false"])
def test_the_job_owns_the_cache_switches(arg: str) -> None:
    assert "cache_path=DIR" in _error("workload", workload=("agent=x", arg))


def test_the_rendered_step_runs_navsim_through_the_cache_phase() -> None:
    spec = JobSpec(**NAVSIM)  # type: ignore[arg-type]
    argv = step_argv(resolve(spec, REG.get("local")))
    program = argv[len(argv) - argv[::-1].index("--"):]
    assert program[:3] == module_argv(spec.python, "train.workloads.navsim")
    assert program[3:5] == [spec.python, NAVSIM_SCRIPT]


OVERRIDES = ["train_test_split=navtrain", "cache_path=/c/cache", "agent=transfuser_agent",
             "agent.config.latent=true", "experiment_name=x", "dataloader.params.num_workers=2"]
COMMAND = ["/py", "/opt/navsim/script/run_training.py", *OVERRIDES]


def test_training_from_the_complete_cache_computes_nothing_and_skips_the_dataset() -> None:
    argv = navsim.training_command([*COMMAND, "force_cache_computation=true"])
    assert argv[:2] == COMMAND[:2]
    assert _keys(argv)["force_cache_computation"] == "false"
    assert _keys(argv)["use_cache_without_dataset"] == "true"
    assert sum(a.startswith("force_cache_computation=") for a in argv) == 1


def test_the_cache_is_computed_by_navsims_caching_script_missing_scenes_only() -> None:
    argv = navsim.caching_command(COMMAND, cpus=8)
    assert argv[:2] == ["/py", "/opt/navsim/script/run_dataset_caching.py"]
    keys = _keys(argv)
    assert keys["force_cache_computation"] == "false"  # a cut cache is completed
    assert "use_cache_without_dataset" not in keys
    assert keys["worker"] == "single_machine_thread_pool" and keys["worker.max_workers"] == "8"
    assert keys["agent"] == "transfuser_agent" and keys["cache_path"] == "/c/cache"
    own = navsim.caching_command([*COMMAND, "worker=ray_distributed"], cpus=8)
    assert _keys(own)["worker"] == "ray_distributed" and "worker.max_workers" not in _keys(own)


def test_the_cache_key_is_the_split_and_the_agent() -> None:
    key = navsim.cache_key(OVERRIDES)
    assert key == {"split": "navtrain",
                   "agent": ["agent=transfuser_agent", "agent.config.latent=true"]}
    assert navsim.cache_key([*OVERRIDES, "experiment_name=y"]) == key


def _navsim_scripts(tmp_path: Path, caching: str) -> list[str]:
    """A training script (never run here) and a caching script beside it."""
    folder = tmp_path / "script"
    folder.mkdir()
    (folder / "run_dataset_caching.py").write_text(caching)
    cache = tmp_path / "cache"
    return [sys.executable, str(folder / "run_training.py"), "train_test_split=navmini",
            f"cache_path={cache}", "agent=ego_status_mlp_agent"]


CACHE_ONE = ("import sys, pathlib; a = dict(x.split('=', 1) for x in sys.argv[1:]); "
             "assert a['force_cache_computation'] == 'false'; "
             "p = pathlib.Path(a['cache_path'], 'log', 'tok'); p.mkdir(parents=True); "
             "(p / 'f.gz').write_text('x'); "
             "open(pathlib.Path(sys.argv[0]).with_name('runs'), 'a').write('1')\n")


def test_the_first_chunk_caches_and_marks_then_later_chunks_only_train(
        tmp_path: Path) -> None:
    command = _navsim_scripts(tmp_path, CACHE_ONE)
    cache = tmp_path / "cache"
    first = navsim.cache_phase(command, {"SLURM_PROCID": "0"})
    assert first == navsim.training_command(command)
    complete, started = navsim.marker_paths(cache)
    assert complete.is_file() and not started.exists()
    assert complete.parent == cache.parent  # beside the cache: NAVSIM lists what is in it
    again = navsim.cache_phase(command, {"SLURM_PROCID": "0"})
    assert again == first
    assert (tmp_path / "script" / "runs").read_text() == "1"  # computed once
    other = [*command[:-1], "agent=transfuser_agent"]
    with pytest.raises(navsim.CacheError) as err:
        navsim.cache_phase(other, {})
    assert err.value.code == 2 and "cache_path=" in str(err.value)


def test_a_failed_caching_is_not_marked_complete(tmp_path: Path) -> None:
    command = _navsim_scripts(tmp_path, "import sys; sys.exit(3)\n")
    with pytest.raises(navsim.CacheError) as err:
        navsim.cache_phase(command, {"SLURM_PROCID": "0"})
    assert err.value.code == 3 and "not marked complete" in str(err.value)
    complete, started = navsim.marker_paths(tmp_path / "cache")
    assert not complete.exists() and started.exists()  # the next start completes it


def test_a_caching_cut_by_the_walltime_signal_is_a_stop_without_marker(
        tmp_path: Path) -> None:
    # the step's USR1 reaches the caching process itself (srun signals the whole task)
    command = _navsim_scripts(tmp_path, "import os, signal; "
                              "os.kill(os.getpid(), signal.SIGUSR1)\n")
    assert navsim.cache_phase(command, {"SLURM_PROCID": "0"}) is None
    complete, started = navsim.marker_paths(tmp_path / "cache")
    assert not complete.exists() and started.exists()


def test_the_tasks_own_stop_signal_after_its_cut_caching_child_s_is_no_death(
        tmp_path: Path) -> None:
    """Slurm signals every process of the step: the caching child may die of USR1 before
    this task gets its own. A cut phase ends the task with exit 0, so that late signal must
    find the handler still there (CI: the task died of USR1, the chain failed)."""
    command = _navsim_scripts(tmp_path, "import os, signal; "
                              "os.kill(os.getpid(), signal.SIGUSR1)\n")
    code = ("import os, signal, sys; from train.workloads import navsim; "
            "r = navsim.cache_phase(sys.argv[1:], {'SLURM_PROCID': '0'}); "
            "os.kill(os.getpid(), signal.SIGUSR1); os.kill(os.getpid(), signal.SIGTERM); "
            "print('alive', r)")
    proc = subprocess.run([sys.executable, "-c", code, *command], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0 and "alive None" in proc.stdout, (proc.returncode,
                                                                   proc.stderr)


def test_a_cut_task_outlives_the_steps_signal_while_it_exits(tmp_path: Path) -> None:
    """Slurm's USR1 reaches the step's processes one by one: the task's own copy may come
    while Python exits, after it reset its handlers to the default (CI: exit 138, the chain
    failed). Here the copies come without end, from the caching child's cut on."""
    command = _navsim_scripts(tmp_path, signals_while_ending("os.getppid()", signal.SIGUSR1)
                              + "import os, signal; os.kill(os.getpid(), signal.SIGUSR1)\n")
    proc = spawn_group([sys.executable, "-m", "train.workloads.navsim", *command],
                       env={**os.environ, "SLURM_PROCID": "0"})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "cut the feature cache" in err, (proc.returncode, err)


def test_a_stop_that_comes_as_the_cache_is_marked_ends_the_task_before_training(
        tmp_path: Path) -> None:
    """The step's stop signal may come after the caching child ended, as its cache is
    marked complete: the task ends as a stop (the next chunk trains from the cache). It
    started the training program with the stop lost, and with USR1 and TERM ignored (its
    signals made deaf to the stop, to scancel, to the walltime's TERM)."""
    command = _navsim_scripts(tmp_path, CACHE_ONE)
    Path(command[1]).write_text("import pathlib, signal, sys\n"
                                "pathlib.Path(sys.argv[0]).with_name('trained').write_text("
                                "str(signal.getsignal(signal.SIGTERM)))\n")
    code = ("import os, signal, sys\n"
            "from train.workloads import navsim\n"
            "write = navsim.write_json_atomic\n"
            "def marking(path, *args, **kwargs):\n"
            "    write(path, *args, **kwargs)\n"
            "    if str(path).endswith(navsim.COMPLETE_SUFFIX):\n"
            "        os.kill(os.getpid(), signal.SIGUSR1)\n"
            "navsim.write_json_atomic = marking\n"
            "sys.exit(navsim.main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", code, *command], capture_output=True,
                          text=True, timeout=120, check=False,
                          env={**os.environ, "SLURM_PROCID": "0"})
    trained = tmp_path / "script" / "trained"
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert not trained.exists(), (trained.read_text(), proc.stderr)
    assert navsim.marker_paths(tmp_path / "cache")[0].is_file()


def test_the_task_is_no_longer_ready_once_its_handlers_are_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine passes the stop on to the ranks that said they are ready: the phase's
    readiness file is gone before the default actions come back (a stop passed on between
    the two killed the task before its training set a handler: exit 138)."""
    command = _navsim_scripts(tmp_path, CACHE_ONE)
    ready = tmp_path / ".signal-ready-7-0"
    seen: list[tuple[int, bool]] = []
    real = signal.signal

    def recording(sig: int, handler: Any) -> Any:
        seen.append((sig, ready.exists()))
        return real(sig, handler)

    monkeypatch.setattr(signal, "signal", recording)
    env = {"SLURM_PROCID": "0", navsim.SIGNAL_READY_VAR: str(ready)}
    assert navsim.cache_phase(command, env) == navsim.training_command(command)
    monkeypatch.undo()
    restored = seen[2:]  # (after the two that installed its handlers)
    assert [s for s, _ in restored] == [signal.SIGUSR1, signal.SIGTERM], seen
    assert [r for _, r in restored] == [False, False], seen
    assert not ready.exists()


def test_other_tasks_wait_for_the_first_tasks_marker(tmp_path: Path) -> None:
    command = _navsim_scripts(tmp_path, "raise SystemExit('not run by rank 1')\n")
    complete = navsim.marker_paths(tmp_path / "cache")[0]
    key = navsim.cache_key(command[2:])
    import threading

    timer = threading.Timer(0.3, lambda: complete.write_text(json.dumps({"key": key})))
    timer.start()
    try:
        assert navsim.cache_phase(command, {"SLURM_PROCID": "1"}, poll=0.05) == \
            navsim.training_command(command)
    finally:
        timer.cancel()


def test_a_cut_cache_loses_the_scenes_written_in_its_last_moments(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for i in range(4):
        scene = cache / "log" / f"tok{i}"
        scene.mkdir(parents=True)
        for name in ("a.gz", "b.gz"):
            (scene / name).write_text("x")
            os.utime(scene / name, (1000.0 + 1000 * i, 1000.0 + 1000 * i))
    # the newest scene (3000 s) and one with a file written 60 s before it go
    os.utime(cache / "log" / "tok2" / "b.gz", (4000.0 - 60, 4000.0 - 60))
    assert navsim.drop_cut_scenes(cache, window=120) == 2
    assert sorted(p.name for p in (cache / "log").iterdir()) == ["tok0", "tok1"]
    assert navsim.drop_cut_scenes(tmp_path / "none") == 0


def test_a_cache_path_of_the_users_counts_as_a_save_path() -> None:
    """A chunk cut while it computes the cache has saved that much: with cache_path= outside
    the run folder the batch shell must look there too, or it ends the chain as 'stopped
    before any save'. The run folder's own cache needs no entry (the run folder counts)."""
    from train.client.slurm.render import save_paths

    own = resolve(JobSpec(**NAVSIM), REG.get("local"))
    assert save_paths(own) == []
    shared = resolve(JobSpec(**{**NAVSIM, "workload": (
        "agent=ego_status_mlp_agent", "cache_path=/scratch/u/cache")}), REG.get("local"))
    assert save_paths(shared) == ["/scratch/u/cache"]


# --- NAVSIM's knowledge lives in NAVSIM's modules, not spread through the job's ----------

HYDRA_KEYS = ("trainer.params.", "+trainer.params.", "dataloader.params.", "train_test_split=")


def _navsim_knowledge(path: Path) -> list[str]:
    """NAVSIM names, its command builder and its Hydra keys that a module defines."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
             for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
             if isinstance(t, ast.Name) and t.id.startswith("NAVSIM")]
    found += [node.name for node in ast.walk(tree)
              if isinstance(node, ast.FunctionDef) and node.name == "navsim_command"]
    found += [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
              and isinstance(node.value, str) and node.value.startswith(HYDRA_KEYS)]
    return found


def test_the_scheduler_layer_holds_no_navsim_presets() -> None:
    """The presets (script, split, data root) and the checks are the client's NAVSIM module
    (train.client.slurm.navsim), the command its step module (navsimstep), and the override
    names that the node reads too (the launcher, the cache phase) are batch.contract's; no
    other module of the job's (render, resolve, jobspec, ...) nor of the node's defines any."""
    src = ROOT / "src" / "train"
    slurm = src / "client" / "slurm"
    ours = ("navsim.py", "navsimstep.py")
    held = {p.name: k for p in sorted(slurm.rglob("*.py"))
            if p.name not in ours and (k := _navsim_knowledge(p))}
    assert held == {}
    own = [k for name in ours for k in _navsim_knowledge(slurm / name)]
    assert {"NAVSIM_SCRIPT", "NAVSIM_SPLIT", "NAVSIM_DATA_ROOT", "navsim_command"} <= set(own)
    shared = _navsim_knowledge(src / "batch" / "contract.py")
    assert {"NAVSIM_WORKERS_OVERRIDE", "NAVSIM_PREFETCH_OVERRIDE", "NAVSIM_SPLIT_OVERRIDE",
            "NAVSIM_CACHE_PATH_OVERRIDE"} <= set(shared)
    node_side = (src / "workloads" / "navsim.py", src / "node" / "launcher" / "environment.py")
    assert [_navsim_knowledge(p) for p in node_side] == [[], []]
