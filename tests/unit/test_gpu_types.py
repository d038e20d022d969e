"""`--gpu-type` is always honoured: typed GRES, a node feature, narrowed constraint
alternatives, or an exit-2 error; and the NAVSIM preset's precision follows every GPU type
the job can land on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli
from train.client.clusters.profiles import Registry
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.navsimstep import navsim_command
from train.client.slurm.resolve import ResolvedJob, resolve
from train.common.errors import ConfigError
from train.common.gpus import COMPUTE_CAPABILITY, all_bf16_capable, bf16_capable, capability

REG = Registry(environ={})
TRAINING = dict(cluster="gilbreth", account="lab", partition="training", qos="training",
                time="4:00:00", gpus_per_node=4, runtime="none")
TORCH = dict(cluster="torch", account="torch_pr_1", gpus_per_node=4, runtime="none")


def _resolve(registry: Registry = REG, **kw: Any) -> ResolvedJob:
    spec = JobSpec(**{"runtime": "none", **kw})  # the runtime is not what these test
    return resolve(spec, registry.get(spec.cluster))


def _sbatch(job: ResolvedJob) -> list[str]:
    from train.client.slurm.render import gpu_option, sbatch_options

    lines = sbatch_options(job)
    assert (gpu_option(job) in lines) if job.spec.gpus_per_node else True
    return lines


def _precision(job: ResolvedJob) -> str:
    found = [a for a in navsim_command(job) if a.startswith("trainer.params.precision=")]
    assert len(found) == 1, found
    return found[0].split("=", 1)[1]


def _profile(tmp_path: Path, text: str) -> Registry:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    return Registry([path], environ={})


# --- the GPU table and the bf16 rule ------------------------------------------------------

@pytest.mark.parametrize(("gpu", "cap"), [("v100", (7, 0)), ("p100", (6, 0)), ("t4", (7, 5)),
                                          ("rtx2080", (7, 5)), ("gtx1080", (6, 1)),
                                          ("a100", (8, 0)), ("a30", (8, 0)), ("a10", (8, 6)),
                                          ("a6000", (8, 6)), ("rtx3090", (8, 6)),
                                          ("l40s", (8, 9)), ("h100", (9, 0)),
                                          ("h200", (9, 0)), ("1g.10gb", (8, 0)),
                                          ("3g.40gb", (8, 0)), ("H100", (9, 0)),
                                          ("nvidia_a100-sxm4-80gb", (8, 0)),
                                          ("v100-32gb", (7, 0)), ("a100_80gb", (8, 0))])
def test_compute_capability_by_gpu_type(gpu: str, cap: tuple[int, int]) -> None:
    assert capability(gpu) == cap


def test_bf16_rule_and_unknown_types() -> None:
    assert bf16_capable((8, 0)) and bf16_capable((9, 0)) and bf16_capable((8, 9))
    assert not bf16_capable((7, 5)) and not bf16_capable(None)
    assert capability("mystery9000") is None and capability("rtx_a6000") is None
    assert all_bf16_capable(["a100", "h100", "l40s"])
    assert not all_bf16_capable(["a100", "v100"])
    assert not all_bf16_capable([])  # nothing known about the GPUs: not capable
    assert not all_bf16_capable(["a100", "mystery9000"])
    assert {g for g, c in COMPUTE_CAPABILITY.items() if not bf16_capable(c)} >= {
        "v100", "p100", "t4", "rtx2080", "gtx1080"}


def test_gpu_table_stays_light_for_the_login_node() -> None:
    import subprocess
    import sys

    code = ("import sys, train.common.gpus, train.client.slurm.resolve, train.client.clusters.profiles\n"
            "assert 'torch' not in sys.modules and 'numpy' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr


# --- Gilbreth: a node feature for the mixed training partition -------------------------

def test_gilbreth_training_h100_requests_the_feature() -> None:
    lines = _sbatch(_resolve(**TRAINING, gpu_type="h100"))
    assert "--constraint=h100" in lines and "--gres=gpu:4" in lines
    assert "--partition=training" in lines


def test_gilbreth_training_without_a_type_has_no_constraint() -> None:
    lines = _sbatch(_resolve(**TRAINING))
    assert not [ln for ln in lines if ln.startswith("--constraint")]


def test_gilbreth_type_implied_by_the_partition_adds_nothing() -> None:
    job = _resolve(cluster="gilbreth", account="lab", partition="a30", qos="standby",
                   gpus_per_node=1, gpu_type="a30")
    assert job.constraint is None and job.gres_type is None
    assert "--gres=gpu:1" in _sbatch(job)


def test_gilbreth_feature_is_anded_onto_the_users_constraint() -> None:
    lines = _sbatch(_resolve(**TRAINING, gpu_type="a100", constraint="nvlink"))
    assert '--constraint="nvlink&a100"' in lines
    job = _resolve(**TRAINING, gpu_type="a100", constraint="nvlink&a100")
    assert job.constraint == "nvlink&a100"  # already there: not repeated


@pytest.mark.parametrize("user", ["nvlink|v100-32gb", "[nvlink|v100-32gb]", "(a|b)",
                                  "nvlink*2"])
def test_feature_cannot_be_anded_onto_alternatives(user: str) -> None:
    with pytest.raises(ConfigError) as err:
        _resolve(**TRAINING, gpu_type="h100", constraint=user)
    assert err.value.field == "constraint"
    assert "cannot AND a feature onto alternatives" in str(err.value)
    assert "h100" in str(err.value)


def test_gilbreth_feature_names_are_overridable(tmp_path: Path) -> None:
    reg = _profile(tmp_path, "name: gilbreth\nextends: gilbreth\n"
                   "gpu_features:\n  h100: gpu_h100\n")
    assert reg.get("gilbreth").gpu_features["v100"] == "v100"  # merged, not replaced
    assert "--constraint=gpu_h100" in _sbatch(_resolve(reg, **TRAINING, gpu_type="h100"))


def test_bad_feature_name_in_a_profile(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _profile(tmp_path, "name: gilbreth\nextends: gilbreth\n"
                 "gpu_features:\n  h100: 'h100|a100'\n")
    assert err.value.field == "profile gilbreth.gpu_features.h100"


# --- a site that cannot select a type --------------------------------------------------

def test_site_without_type_requests_refuses_a_type_in_a_mixed_partition(
        tmp_path: Path) -> None:
    reg = _profile(tmp_path, "name: gilbreth\nextends: gilbreth\ngpu_type_request: none\n")
    with pytest.raises(ConfigError) as err:
        _resolve(reg, **TRAINING, gpu_type="h100")
    assert err.value.field == "gpu_type"
    msg = str(err.value)
    assert "gpu_type_request: none" in msg and "mixes v100, a100, h100" in msg
    assert "'h100' cannot be honoured" in msg
    # a type the partition implies needs no request
    job = _resolve(reg, cluster="gilbreth", account="lab", partition="v100",
                   gpus_per_node=2, gpu_type="v100")
    assert job.constraint is None and "--gres=gpu:2" in _sbatch(job)


def test_site_without_type_requests_exits_2(tmp_path: Path) -> None:
    profile = tmp_path / "site.yaml"
    profile.write_text("name: gilbreth\nextends: gilbreth\ngpu_type_request: none\n")
    proc = run_cli(["render", "--profile", str(profile), "--cluster", "gilbreth",
                    "--account", "lab", "--partition", "training", "--qos", "training",
                    "--gpus-per-node", "4", "--gpu-type", "h100", "--", "demo"],
                   cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "gpu_type:" in proc.stderr and "gpu_type_request: none" in proc.stderr


def test_local_untyped_gpus_refuse_a_type() -> None:
    with pytest.raises(ConfigError) as err:
        _resolve(cluster="local", gpus_per_node=1, gpu_type="a100")
    assert err.value.field == "gpu_type" and "none (untyped GPUs)" in str(err.value)


def test_profile_keys_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _profile(tmp_path, "name: x\nextends: local\ngpu_type_request: features\n")
    assert err.value.field == "profile x.gpu_type_request"
    with pytest.raises(ConfigError) as err:
        _profile(tmp_path, "name: x\nextends: local\ngpu_request: gres_typed\n")
    assert "gpu_type_request: gres" in str(err.value)


# --- Torch: constraint alternatives narrowed to the type ---------------------------------

def test_torch_type_narrows_the_alternatives() -> None:
    job = _resolve(**{**TORCH, "gpus_per_node": 8}, constraint="h200|l40s",
                   gpu_type="h200")
    assert job.node.name == "h200" and job.node.gpus_per_node == 8
    lines = _sbatch(job)
    assert "--constraint=h200" in lines and "--gres=gpu:8" in lines
    job = _resolve(**TORCH, constraint="h200|l40s", gpu_type="l40s")
    assert job.constraint == "l40s" and job.node.mem_mb == 256 * 1024


def test_torch_without_a_type_fits_every_alternative() -> None:
    job = _resolve(**TORCH, constraint="h200|l40s")
    assert job.constraint == "h200|l40s" and job.node.gpus_per_node == 4
    with pytest.raises(ConfigError) as err:
        _resolve(**{**TORCH, "gpus_per_node": 8}, constraint="h200|l40s")
    assert err.value.field == "gpus_per_node"


def test_one_type_for_all_nodes_is_slurms_matching_or() -> None:
    """Issue 19: `[h200|l40s]` was refused; `h200|l40s` on several nodes could mix L40S and
    H200 nodes in one DDP job. Plain alternatives of a multi-node job are bracketed."""
    job = _resolve(**TORCH, constraint="[h200|l40s]")
    assert job.constraint == "[h200|l40s]" and job.node.gpus_per_node == 4
    assert '--constraint="[h200|l40s]"' in _sbatch(job)
    job = _resolve(**TORCH, nodes=2, constraint="h200|l40s")
    assert job.constraint == "[h200|l40s]"
    assert _resolve(**TORCH, constraint="h200|l40s").constraint == "h200|l40s"  # one node
    # narrowed to one type: nothing to bracket
    assert _resolve(**TORCH, nodes=2, constraint="[h200|l40s]",
                    gpu_type="l40s").constraint == "l40s"
    with pytest.raises(ConfigError) as err:
        _resolve(**TORCH, constraint="[h200|nope]")
    assert err.value.field == "constraint" and "[a|b]" in str(err.value)
    # a partition site's own constraint: bracketed too, or refused where it is no plain OR
    base = dict(cluster="gilbreth", account="lab", partition="a100-40gb", gpus_per_node=2,
                nodes=2)
    assert _resolve(**base, constraint="nvlink|fast").constraint == "[nvlink|fast]"
    assert _resolve(**base, constraint="[nvlink|fast]").constraint == "[nvlink|fast]"
    assert _resolve(**{**base, "nodes": 1}, constraint="a|b").constraint == "a|b"
    with pytest.raises(ConfigError) as err:
        _resolve(**base, constraint="nvlink&fast|slow")
    assert err.value.field == "constraint" and "[a|b]" in str(err.value)


def test_torch_type_on_no_alternative() -> None:
    with pytest.raises(ConfigError) as err:
        _resolve(**TORCH, constraint="h200|l40s", gpu_type="a100")
    assert err.value.field == "gpu_type" and "h200|l40s has no 'a100'" in str(err.value)


MIXED_TORCH = """name: torch
extends: torch
gpu_features: {h200: gpu_h200}
constraints:
  mixed: {gpus_per_node: 4, gpu_types: [h200, l40s], cpus_per_node: 64,
          mem_per_node: 256G, max_time: "2-00:00:00"}
  mixed2: {gpus_per_node: 4, gpu_types: [h200, a100], cpus_per_node: 64,
           mem_per_node: 256G, max_time: "2-00:00:00"}
  l40s: {gpus_per_node: 4, gpu_types: [l40s], cpus_per_node: 64,
         mem_per_node: 256G, max_time: "2-00:00:00"}
"""


def test_constraint_site_with_a_mixed_node_type(tmp_path: Path) -> None:
    reg = _profile(tmp_path, MIXED_TORCH)
    job = _resolve(reg, **TORCH, constraint="mixed|l40s", gpu_type="h200")
    assert job.constraint == "mixed&gpu_h200"
    assert '--constraint="mixed&gpu_h200"' in _sbatch(job)
    with pytest.raises(ConfigError) as err:
        _resolve(reg, **TORCH, constraint="mixed|mixed2", gpu_type="h200")
    assert err.value.field == "constraint"
    # both alternatives have l40s, but mixed also has h200: the feature is needed and
    # cannot be ANDed onto the alternatives
    with pytest.raises(ConfigError) as err:
        _resolve(reg, **TORCH, constraint="mixed|l40s", gpu_type="l40s")
    assert err.value.field == "constraint"
    assert _resolve(reg, **TORCH, constraint="mixed", gpu_type="l40s").constraint \
        == "mixed&l40s"


# --- Rivanna: typed GRES -----------------------------------------------------------------

def test_rivanna_types_the_gres() -> None:
    job = _resolve(cluster="rivanna", account="g", gpus_per_node=2, gpu_type="a100")
    assert job.gres_type == "a100" and "--gres=gpu:a100:2" in _sbatch(job)
    mig = _resolve(cluster="rivanna", account="g", partition="gpu-mig", gpus_per_node=1,
                   gpu_type="1g.10gb")
    assert "--gres=gpu:1g.10gb:1" in _sbatch(mig)
    assert "--gres=gpu:2" in _sbatch(_resolve(cluster="rivanna", account="g",
                                              gpus_per_node=2))


def test_typed_gpus_per_node(tmp_path: Path) -> None:
    reg = _profile(tmp_path, "name: rivanna\nextends: rivanna\ngpu_request: gpus_per_node\n")
    job = _resolve(reg, cluster="rivanna", account="g", gpus_per_node=2, gpu_type="v100")
    assert "--gpus-per-node=v100:2" in _sbatch(job)


# --- NAVSIM precision from every GPU type the job can land on ----------------------------

NAVSIM: dict[str, Any] = dict(entry="navsim", workload=())


@pytest.mark.parametrize(("kw", "expected"), [
    (dict(cluster="gilbreth", account="lab", partition="v100", gpus_per_node=2), "16-mixed"),
    (dict(cluster="gilbreth", account="lab", partition="v100", gpus_per_node=2,
          gpu_type="v100"), "16-mixed"),
    (dict(TRAINING), "16-mixed"),
    (dict(TRAINING, gpu_type="a100"), "bf16-mixed"),
    (dict(TRAINING, gpu_type="v100"), "16-mixed"),
    (dict(cluster="gilbreth", account="lab", partition="a30", gpus_per_node=1), "bf16-mixed"),
    (dict(TORCH, constraint="l40s"), "bf16-mixed"),
    (dict(TORCH, constraint="h200|l40s"), "bf16-mixed"),
    (dict(cluster="rivanna", account="g", gpus_per_node=1), "16-mixed"),
    (dict(cluster="rivanna", account="g", gpus_per_node=1, gpu_type="a6000"), "bf16-mixed"),
    (dict(cluster="rivanna", account="g", partition="gpu-mig", gpus_per_node=1),
     "bf16-mixed"),
    (dict(cluster="local", gpus_per_node=1), "16-mixed"),  # untyped: nothing known
])
def test_navsim_precision(kw: dict[str, Any], expected: str) -> None:
    assert _precision(_resolve(**kw, **NAVSIM)) == expected


def test_navsim_unknown_gpu_type_is_fp16(tmp_path: Path) -> None:
    reg = _profile(tmp_path, "name: local\nextends: local\npartitions:\n  debug:\n"
                   "    gpus_per_node: 2\n    gpu_types: [mystery9000]\n    cpus_per_node: 4\n"
                   "    mem_per_node: 8000M\n    max_time: '60:00'\n")
    assert _precision(_resolve(reg, cluster="local", gpus_per_node=1, **NAVSIM)) \
        == "16-mixed"
    assert _precision(_resolve(reg, cluster="local", gpus_per_node=1,
                               gpu_type="mystery9000", **NAVSIM)) == "16-mixed"
