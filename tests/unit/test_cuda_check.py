"""A GPU job uses the GPU or stops: the CUDA check's causes (injected facts), `--device
cuda` (exit 3, nothing written), `--device auto` (a warning, the CPU), `train launch`."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import TINY, run_cli, tiny_flags
from train.common import cuda_check
from train.common.cuda_check import (
    PYNVML_MISSING,
    CudaFacts,
    check,
    cuda_version,
    expected_devices,
    gather_facts,
    parse_version,
)
from train.common.errors import EXIT_RESOURCE, ResourceError
from train.node.distributed import init_distributed, resolve_device
from train.node.launch import LaunchOptions, prepare
from train.node.launcher import environment
from train.node.launcher import step as launcher_step
from train.workloads import runner
from train.workloads.config import RunConfig

# A healthy node: the base image's torch (CUDA 13.0) on a driver that supports CUDA 13.0.
OK = CudaFacts(torch_version="2.13.0", torch_cuda="13.0", torch_available=True,
               torch_devices=2, visible_devices="0,1", driver_cuda=13000,
               driver_version="580.65.06", nvml_gpus=2)
# The same image on a node whose driver supports CUDA 12.4 only: what torch then says.
OLD_DRIVER = dataclasses.replace(
    OK, torch_available=False, torch_devices=0, driver_cuda=12040, driver_version="550.54.15",
    torch_error="CUDA initialization: The NVIDIA driver on your system is too old (found "
                "version 12040).")
CPU_BUILD = CudaFacts(torch_version="2.13.0+cpu", torch_cuda=None, torch_available=False,
                      torch_devices=0, visible_devices=None, driver_cuda=None,
                      nvml_error="NVMLError_LibraryNotFound: NVML Shared Library Not Found")
NO_DRIVER = dataclasses.replace(OK, torch_available=False, torch_devices=0, driver_cuda=None,
                                driver_version=None, nvml_gpus=None,
                                nvml_error="NVMLError_LibraryNotFound: NVML Shared Library "
                                           "Not Found")
NONE_VISIBLE = dataclasses.replace(OK, torch_available=False, torch_devices=0,
                                   visible_devices="")
FEWER = dataclasses.replace(OK, torch_devices=1)

# one phrase per cause; each message has its own and no other's
CAUSES = {
    "cpu build": "is a CPU-only build",
    "no driver": "no NVIDIA driver is reachable",
    "old driver": "the NVIDIA driver is too old",
    "none visible": "no GPU is visible",
    "fewer": "torch sees fewer GPUs than expected",
}


def _only_cause(message: str | None, cause: str) -> str:
    assert message is not None
    assert message.startswith("CUDA is unusable: ")
    assert CAUSES[cause] in message, message
    others = [c for name, c in CAUSES.items() if name != cause and c in message]
    assert not others, (others, message)
    assert "Fix: " in message and "--device cpu" in message
    return message


# -- the pure rule ----------------------------------------------------------------------

def test_usable_cuda_is_none() -> None:
    assert check(OK) is None
    assert check(dataclasses.replace(OK, visible_devices=None)) is None  # NVML's count: 2
    # more devices than expected is fine; a driver newer than the build too
    assert check(dataclasses.replace(OK, torch_devices=4, driver_cuda=13020)) is None


def test_cpu_only_torch_build() -> None:
    message = _only_cause(check(CPU_BUILD), "cpu build")
    assert "torch 2.13.0+cpu" in message and "torch.version.cuda is None" in message
    assert "base-cu130.txt" in message and "CUDA build of torch" in message  # the fix
    # whatever the driver says: a CPU build never uses it
    assert _only_cause(check(dataclasses.replace(OLD_DRIVER, torch_cuda=None)), "cpu build")


def test_no_driver_or_nvml_cannot_initialise() -> None:
    message = _only_cause(check(NO_DRIVER), "no driver")
    assert "NVML cannot initialise (NVMLError_LibraryNotFound: NVML Shared Library Not Found)" \
        in message
    assert "apptainer exec --nv" in message and "docker run --gpus all" in message
    assert "GPU node" in message


def test_driver_library_mismatch_is_named() -> None:
    facts = dataclasses.replace(NO_DRIVER, nvml_error="NVMLError_LibRmVersionMismatch: RM "
                                                      "has detected an NVML/RM version mismatch.")
    message = _only_cause(check(facts), "no driver")
    assert "driver update without a reboot" in message and "another node" in message


def test_pynvml_missing_is_a_fact_not_a_crash() -> None:
    facts = dataclasses.replace(NO_DRIVER, nvml_error=PYNVML_MISSING)
    message = check(facts)
    assert message is not None and PYNVML_MISSING in message
    assert "install nvidia-ml-py" in message and "CUDA 13.0" in message


@pytest.mark.parametrize(("driver_cuda", "driver", "built", "have", "need", "variant"), [
    # the base image on a 550 node: the CUDA 12.8 variant runs there
    (12040, "550.54.15", "13.0", "12.4", ">= 580", "BASE_LOCK=base-cu128.txt"),
    (12020, "535.104.05", "13.0", "12.2", ">= 580", "BASE_LOCK=base-cu128.txt"),
    # no shipped variant is built for CUDA 11: what to build
    (11080, "520.61.05", "12.8", "11.8", ">= 525", "a lock of a CUDA 11.x torch"),
])
def test_driver_older_than_torch_build(driver_cuda: int, driver: str, built: str, have: str,
                                       need: str, variant: str) -> None:
    facts = dataclasses.replace(OLD_DRIVER, driver_cuda=driver_cuda, driver_version=driver,
                                torch_cuda=built)
    message = _only_cause(check(facts), "old driver")
    # both versions and the driver's
    assert f"driver {driver} supports CUDA up to {have}" in message
    assert f"was built for CUDA {built} (needs an NVIDIA driver {need})" in message
    # the fix: an image variant for that driver (one that exists), or a node with a newer one
    assert variant in message
    assert f"nodes whose driver is {need}" in message
    assert "too old (found version" in message  # what torch itself said


def test_a_driver_of_the_same_major_runs_a_newer_minor_build() -> None:
    """CUDA's minor-version compatibility: a cu128 torch runs on driver 535 (CUDA 12.2), so
    that pair is never called "too old"."""
    facts = dataclasses.replace(OK, driver_cuda=12020, driver_version="535.104.05",
                                torch_cuda="12.8")
    assert check(facts) is None
    unavailable = dataclasses.replace(facts, torch_available=False, torch_devices=0,
                                      torch_error=None)
    message = check(unavailable)
    assert message is not None and "too old" not in message
    assert cuda_check.driver_runs((12, 2), (12, 8))
    assert not cuda_check.driver_runs((12, 9), (13, 0))
    assert not cuda_check.driver_runs((10, 1), (10, 2))  # before CUDA 11: the minor counts


def test_every_variant_named_in_a_fix_is_shipped() -> None:
    locks = Path(__file__).parents[2] / "containers" / "requirements"
    for lock, (cuda, base) in cuda_check.VARIANTS.items():
        text = (locks / lock).read_text()
        assert f"# cuda {cuda[0]}.{cuda[1]}" in text, lock
        assert base.startswith(f"nvidia/cuda:{cuda[0]}.{cuda[1]}"), base


@pytest.mark.parametrize(("change", "why"), [
    ({"visible_devices": ""}, "CUDA_VISIBLE_DEVICES='' hides every GPU"),
    ({"visible_devices": "-1"}, "CUDA_VISIBLE_DEVICES='-1' hides every GPU"),
    ({"visible_devices": "NoDevFiles"}, "CUDA_VISIBLE_DEVICES='NoDevFiles' hides every GPU"),
    ({"visible_devices": None, "slurm_job_id": "4242"},
     "SLURM job 4242 was given no GPU (SLURM_GPUS_ON_NODE unset, CUDA_VISIBLE_DEVICES unset)"),
    ({"visible_devices": None, "slurm_job_id": "4242", "slurm_gpus": "0"},
     "SLURM job 4242 was given no GPU (SLURM_GPUS_ON_NODE '0'"),
    # NVML cannot start in a job without GPUs (cgroup): the job, not the driver, is named
    ({"visible_devices": None, "slurm_job_id": "4242", "driver_cuda": None,
      "nvml_error": "NVMLError_NoPermission: Insufficient Permissions"},
     "SLURM job 4242 was given no GPU"),
    ({"visible_devices": None, "nvml_gpus": 0},
     "the NVIDIA driver 580.65.06 is loaded but NVML sees no GPU"),
])
def test_no_gpu_visible(change: dict[str, Any], why: str) -> None:
    message = _only_cause(check(dataclasses.replace(NONE_VISIBLE, **change)), "none visible")
    assert why in message
    assert "--gpus-per-node N" in message and "--gres=gpu:N" in message


def test_an_old_driver_is_named_before_a_missing_slurm_gpu_count() -> None:
    """Where NVML reads the driver, its version decides (some sites set no
    SLURM_GPUS_ON_NODE)."""
    facts = dataclasses.replace(OLD_DRIVER, visible_devices=None, slurm_job_id="4242")
    _only_cause(check(facts), "old driver")


def test_torch_sees_fewer_devices_than_expected() -> None:
    message = _only_cause(check(FEWER), "fewer")
    assert "1 of 2" in message and "CUDA_VISIBLE_DEVICES='0,1'" in message
    assert "NVML sees 2" in message and "nvidia-smi -L" in message
    # CUDA_VISIBLE_DEVICES names a device this node lacks: torch sees none, NVML is fine
    lost = dataclasses.replace(OK, torch_available=False, torch_devices=0, visible_devices="3")
    message = _only_cause(check(lost), "fewer")
    assert "0 of 1" in message and "CUDA_VISIBLE_DEVICES='3'" in message
    # the caller's expectation wins over the facts'
    assert check(OK, expected=4) is not None and "2 of 4" in str(check(OK, expected=4))
    assert check(FEWER, expected=1) is None


def test_mig_slices_do_not_count_as_missing_devices() -> None:
    mig = dataclasses.replace(OK, torch_devices=1, visible_devices="MIG-a1b2,MIG-c3d4")
    assert expected_devices(mig) == 1 and check(mig) is None
    mig_mode = dataclasses.replace(OK, torch_devices=1, visible_devices=None, mig=True)
    assert check(mig_mode) is None


def test_version_helpers() -> None:
    assert cuda_version(12040) == (12, 4) and cuda_version(13000) == (13, 0)
    assert cuda_version(11080) == (11, 8)
    assert parse_version("13.0") == (13, 0) and parse_version("12.8") == (12, 8)
    assert parse_version("12") == (12, 0) and parse_version("rocm") is None
    assert expected_devices(dataclasses.replace(OK, visible_devices="0,1,-1,2")) == 2
    assert expected_devices(dataclasses.replace(OK, visible_devices=None, nvml_gpus=None)) \
        is None


# -- gathering the real facts --------------------------------------------------------------

def test_gather_facts_reads_this_machine() -> None:
    facts = gather_facts({"CUDA_VISIBLE_DEVICES": "0", "SLURM_JOB_ID": "7"})
    assert facts.torch_version == torch.__version__
    assert facts.torch_cuda == torch.version.cuda
    assert facts.torch_available == torch.cuda.is_available()
    assert facts.visible_devices == "0" and facts.slurm_job_id == "7"
    if facts.driver_cuda is None:
        assert facts.nvml_error  # why NVML said nothing
    assert (check(facts) is None) == (torch.cuda.is_available()
                                      and torch.cuda.device_count() >= 1)


def test_gather_facts_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    facts = gather_facts({})
    assert facts.driver_cuda is None and facts.nvml_error == PYNVML_MISSING
    assert facts.nvml_gpus is None and facts.driver_version is None


def test_gather_facts_keeps_what_torch_warned(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA build on an old driver: torch warns and reports no GPU; the cause survives,
    without torch's download advice."""
    import warnings

    def unavailable() -> bool:
        warnings.warn("CUDA initialization: The NVIDIA driver on your system is too old "
                      "(found version 12040). Please update your GPU driver by downloading "
                      "and installing a new version from the URL: http://www.nvidia.com/"
                      "Download/index.aspx (Triggered internally at CUDAFunctions.cpp:109.)",
                      UserWarning, stacklevel=1)
        return False

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", unavailable)
    facts = gather_facts({})
    assert facts.torch_cuda == "13.0" and not facts.torch_available
    assert facts.torch_error == ("CUDA initialization: The NVIDIA driver on your system is "
                                 "too old (found version 12040).")
    message = check(dataclasses.replace(facts, driver_cuda=12040, driver_version="550.54.15"))
    assert message is not None and "torch said: CUDA initialization: The NVIDIA driver on " \
        "your system is too old (found version 12040). Fix:" in message


# -- `train run`: cuda stops, auto warns -------------------------------------------------

def _inject(monkeypatch: pytest.MonkeyPatch, facts: CudaFacts) -> None:
    monkeypatch.setattr(cuda_check, "gather_facts", lambda environ=None: facts)


def test_device_cuda_with_unusable_cuda_is_a_resource_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _inject(monkeypatch, OLD_DRIVER)
    with pytest.raises(ResourceError) as err:
        resolve_device("cuda")
    assert err.value.exit_code == EXIT_RESOURCE == 3
    assert str(err.value).startswith("--device cuda: CUDA is unusable: the NVIDIA driver is "
                                     "too old")
    # cpu never looks at CUDA
    monkeypatch.setattr(cuda_check, "gather_facts", _never)
    assert resolve_device("cpu") == (torch.device("cpu"), None)


def _never(environ: object = None) -> CudaFacts:
    raise AssertionError("the CUDA facts were gathered")


def test_device_auto_falls_back_to_the_cpu_with_a_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _inject(monkeypatch, OLD_DRIVER)
    with caplog.at_level(logging.WARNING):
        ctx = init_distributed("auto", {})
    assert ctx.device == torch.device("cpu")
    assert ctx.cuda_problem == check(OLD_DRIVER)
    record = next(r for r in caplog.records if "--device auto" in r.getMessage())
    assert record.levelno == logging.WARNING
    assert "training on the CPU: CUDA is unusable: the NVIDIA driver is too old" in \
        record.getMessage() and "550.54.15" in record.getMessage()


def test_device_auto_with_fewer_gpus_uses_them_and_warns(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    _inject(monkeypatch, FEWER)
    with caplog.at_level(logging.WARNING):
        device, problem = resolve_device("auto", local_rank=1)
    assert device == torch.device("cuda", 0) and problem == check(FEWER)
    assert "using the GPUs torch sees, but CUDA is unusable: torch sees fewer" in caplog.text
    with pytest.raises(ResourceError, match="1 of 2"):
        resolve_device("cuda")


def test_a_gpu_the_build_has_no_code_for_stops_auto_and_cuda_alike(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A V100 under the CUDA 13 build: torch sees it, but every kernel would fail, so even
    --device auto stops before training (exit 3) with the variant to use."""
    v100 = dataclasses.replace(OK, torch_devices=1, visible_devices="0", nvml_gpus=1,
                               arch_list=("sm_75", "sm_80", "sm_90"),
                               gpus=(("Tesla V100-SXM2-32GB", (7, 0)),))
    _inject(monkeypatch, v100)
    for request in ("auto", "cuda"):
        with pytest.raises(ResourceError, match="no code for Tesla V100") as err:
            resolve_device(request)
        assert err.value.exit_code == EXIT_RESOURCE
        assert "base-cu128.txt" in str(err.value)


def test_run_stops_before_writing_anything(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The check runs when the device is chosen, after validation (which writes nothing)
    and before the run directory, config.json or a CSV row exist."""
    _inject(monkeypatch, OLD_DRIVER)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # restored
    out = tmp_path / "runs" / "r"
    cfg = RunConfig(**{**TINY, "device": "cuda", "out": str(out), "episodes": 2})
    with pytest.raises(ResourceError, match="too old"):
        runner.run(cfg)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_cli_device_cuda_without_usable_cuda_exits_3(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a usable GPU")
    out = tmp_path / "runs" / "r"
    proc = run_cli(["run", "demo", *tiny_flags(device="cuda"), "--episodes", "2", "--out",
                    str(out)])
    assert proc.returncode == 3, proc.stderr
    cause = check(gather_facts())  # this machine's cause, e.g. the CPU-only build in CI
    assert cause is not None
    assert f"train: error: --device cuda: {cause}" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no run directory, no results.csv


def test_device_auto_without_any_gpu_says_so_without_a_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A CPU-only torch where no GPU is in sight (a laptop, the demo): nothing to fix, so no
    warning; with a GPU in sight (the job was given one) the cause is a warning."""
    _inject(monkeypatch, CPU_BUILD)
    with caplog.at_level(logging.INFO):
        device, problem = resolve_device("auto")
    assert device == torch.device("cpu") and problem == check(CPU_BUILD)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert "--device auto: no GPU here, training on the CPU" in caplog.text
    caplog.clear()
    _inject(monkeypatch, dataclasses.replace(CPU_BUILD, slurm_job_id="7", slurm_gpus="1"))
    with caplog.at_level(logging.INFO):
        resolve_device("auto")
    assert any(r.levelno == logging.WARNING and "is a CPU-only build" in r.getMessage()
               for r in caplog.records)


@pytest.mark.slow
def test_cli_device_auto_trains_on_the_cpu_of_a_gpu_less_machine(tmp_path: Path) -> None:
    facts = gather_facts()
    if torch.cuda.is_available() or facts.nvml_gpus:
        pytest.skip("this machine has a GPU: auto trains on it, or warns why not")
    out = tmp_path / "r"
    proc = run_cli(["run", "demo", *tiny_flags(device="auto"), "--episodes", "2", "--out",
                    str(out)])
    assert proc.returncode == 0, proc.stderr
    cause = check(facts)
    assert cause is not None
    # no GPU here: a line that says so, not a WARNING about CUDA (the cause is recorded)
    assert "INFO train.node.distributed: --device auto: no GPU here, training on the " \
        "CPU" in proc.stderr
    assert "WARNING" not in proc.stderr and "CUDA is unusable" not in proc.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["cuda_problem"] == cause and config["versions"]["gpu"] is None
    assert config["precision"] == "fp32"
    assert json.loads((out / "status.json").read_text())["complete"] is True


# -- `train launch` ------------------------------------------------------------------------

STEP_ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu-a01", "SLURM_NNODES": "1",
            "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
            "SLURM_CPUS_PER_TASK": "4", "TRAIN_MASTER_ADDR": "10.0.0.1"}


def test_launch_gpu_step_stops_on_unusable_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []

    def gather(environ: object = None) -> CudaFacts:
        seen.append(environ)
        return OLD_DRIVER

    def no_wait(*args: object) -> bool:
        raise AssertionError("waited for GPU memory on a broken CUDA")

    monkeypatch.setattr(cuda_check, "gather_facts", gather)
    monkeypatch.setattr(environment, "wait_for_gpu_memory", no_wait)
    env = {**STEP_ENV, "CUDA_VISIBLE_DEVICES": "0,1"}
    opts = LaunchOptions(mode="torchrun", command=["python", "-m", "train", "run", "demo"],
                         min_free_mb=1000)
    with pytest.raises(ResourceError) as err:
        prepare(opts, env)
    assert err.value.exit_code == 3
    assert str(err.value).startswith("this step has 2 GPU(s) on node gpu-a01, but CUDA is "
                                     "unusable: the NVIDIA driver is too old")
    assert "12.4" in str(err.value) and "13.0" in str(err.value)
    assert seen == [env]  # the step's environment, checked once


def test_launch_gpu_step_with_usable_cuda_goes_on(monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    _inject(monkeypatch, OK)
    env = {**STEP_ENV, "SLURM_GPUS_ON_NODE": "2"}
    with caplog.at_level(logging.INFO):
        step, master, command = prepare(LaunchOptions(mode="tasks", command=["true"]), env)
    assert step.gpus_on_node == 2 and master == "10.0.0.1" and command == ["true"]
    assert "CUDA check passed: 2 GPU(s) usable" in caplog.text


def test_launch_cpu_step_does_not_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_check, "gather_facts", _never)
    for env in (STEP_ENV, {**STEP_ENV, "CUDA_VISIBLE_DEVICES": ""}):
        step, _master, _command = prepare(LaunchOptions(mode="tasks", command=["true"]),
                                          dict(env))
        assert step.gpus_on_node == 0


@pytest.mark.slow
def test_cli_launch_on_a_gpu_step_without_usable_cuda_exits_3(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a usable GPU")
    marker = tmp_path / "ran"
    proc = run_cli(["launch", "--mode", "tasks", "--", "touch", str(marker)],
                   env={**STEP_ENV, "CUDA_VISIBLE_DEVICES": "0"})
    assert proc.returncode == 3, proc.stderr
    assert "this step has 1 GPU(s) on node gpu-a01, but CUDA is unusable:" in proc.stderr
    assert not marker.exists()  # no worker started


# -- on a real GPU -------------------------------------------------------------------------

@pytest.mark.gpu
def test_real_gpu_passes_the_check_and_trains(tmp_path: Path) -> None:
    facts = gather_facts()
    assert check(facts) is None, facts
    assert facts.torch_devices >= 1 and facts.driver_cuda is not None
    # the architecture facts are read from torch, and this GPU is among them
    assert facts.arch_list and facts.gpus and len(facts.gpus) == facts.torch_devices
    assert not cuda_check.unserved_gpus(facts)
    environment.check_cuda(launcher_step.read_step({**STEP_ENV, "SLURM_GPUS_ON_NODE": "1"}), {})
    out = tmp_path / "r"
    proc = run_cli(["run", "demo", *tiny_flags(device="cuda"), "--episodes", "2",
                    "--time-budget", "300", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert "CUDA is unusable" not in proc.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["cuda_problem"] is None
    assert config["versions"]["gpu"] == torch.cuda.get_device_name(0)
