"""NAVSIM's preset (split, workers without prefetch, script and strategy options) and the
navsim image's import list (the lock check of `nox -s navsim_lock` and the image's %test)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from train.clusters.profiles import Registry
from train.errors import ConfigError
from train.slurm.job import NAVSIM_SCRIPT, JobSpec, navsim_command, resolve

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
