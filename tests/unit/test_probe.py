"""Parsing and comparing what a site's Slurm says (train.client.clusters.probe), the words of a
refusal of `sbatch --test-only` (train.client.slurm.testonly) and of a pending reason
(train.client.slurm.queue): outputs as Slurm prints them, from sites' nodes such as Gilbreth's
(typed GRES, several node types in one partition)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from train.client.clusters.probe import command, write
from train.client.clusters.probe import site as probe_site
from train.client.clusters.profiles import Registry
from train.client.slurm import chainstatus, queue, testonly
from train.common.errors import ConfigError

# sinfo -h -N -o SINFO_FORMAT on a site with typed GPUs and a partition of two node types
SITE = """\
a100|g001|64|512000|gpu:a100:4(S:0-1)|a100,hdr|2-00:00:00|1-4|a100*
a100|g002|128|1024000|gpu:a100:8(S:0-1)|a100,hdr|2-00:00:00|1-4|a100*
mixed|g003|32|256000|gpu:v100:2,gpu:a30:2|v100,a30|infinite|1-infinite|mixed
cpu|c001|128|256000|(null)|(null)|4:00:00|1-infinite|cpu
cpu|c002|128|256000|(null)|(null)|4:00:00|1-infinite|cpu
"""


def test_gres_as_sinfo_prints_it() -> None:
    assert probe_site.parse_gres("gpu:2") == (2, ())
    assert probe_site.parse_gres("gpu:a100:4(S:0-1)") == (4, ("a100",))
    assert probe_site.parse_gres("gpu:v100:2,gpu:a30:2") == (4, ("v100", "a30"))
    assert probe_site.parse_gres("gpu:h100:8(S:0-1),shard:h100:32") == (8, ("h100",))
    assert probe_site.parse_gres("(null)") == (0, ())


def test_sinfo_lines_become_partitions_described_by_their_smallest_node() -> None:
    site = probe_site.Site(nodes=probe_site.parse_sinfo(SITE))
    parts = site.partitions()
    assert list(parts) == ["a100", "mixed", "cpu"]
    a100 = parts["a100"]
    assert (a100.nodes, a100.cpus, a100.mem_mb, a100.gpus, a100.gpu_types) == (
        2, 64, 512000, 4, ("a100",))
    assert a100.uneven and a100.max_minutes == 2880 and a100.max_nodes == 4
    assert a100.features == ("a100", "hdr")
    mixed = parts["mixed"]
    assert mixed.gpus == 4 and mixed.gpu_types == ("a30", "v100") and mixed.max_minutes is None
    assert parts["cpu"].gpus == 0 and parts["cpu"].max_nodes is None
    assert site.default_partition() == "a100"
    assert site.feature("hdr") is not None and site.feature("h100") is None


@pytest.mark.parametrize("line", ["a|b|c", "p|n|four|8000|gpu:2|(null)|1:00:00|1|p",
                                  "p|n|4|8000|gpu:2|(null)|soon|1|p",
                                  # what no profile can hold: blamed on sinfo, not the profile
                                  "a b|n|4|8000|gpu:2|(null)|1:00:00|1|p",
                                  "p|n|4|0|gpu:2|(null)|1:00:00|1|p",
                                  "p|n|4|8000|gpu:-x:2|(null)|1:00:00|1|p",
                                  "p|n|4|8000|gpu:2|(null)|1:00:00|1-many|p"])
def test_a_sinfo_line_that_is_not_understood_is_an_error_naming_the_line(line: str) -> None:
    with pytest.raises(ValueError, match="sinfo line 1"):
        probe_site.parse_sinfo(line)


def test_config_and_qos_as_scontrol_and_sacctmgr_print_them() -> None:
    config = probe_site.parse_config("KillWait                = 30 sec\nPreemptMode             = "
                                "REQUEUE\nSLURM_VERSION           = 24.11.1\nOther = x\n")
    assert config == {"KillWait": "30 sec", "PreemptMode": "REQUEUE",
                      "SLURM_VERSION": "24.11.1"}
    assert probe_site.parse_qos("normal|2-00:00:00\nstandby|04:00:00\nlong|\n") == {
        "normal": 2880, "standby": 240, "long": None}


def _profile(tmp_path: Path, text: str) -> Registry:
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    return Registry([path], environ={})


MINE = """\
name: mine
extends: local
partitions:
  a100:
    gpus_per_node: 8
    gpu_types: [a100]
    cpus_per_node: 64
    mem_per_node: 400G
    max_time: "4-00:00:00"
    max_nodes: 4
    max_gpus: 16
    cpu_jobs: false
    multi_node_whole: true
  gone:
    gpus_per_node: 0
    cpus_per_node: 4
    mem_per_node: 8G
    max_time: "1:00:00"
partition:
  default: gone
qos:
  limits: {normal: "1-00:00:00"}
"""


def test_each_difference_is_one_line_profile_says_site_says(tmp_path: Path) -> None:
    prof = _profile(tmp_path, MINE).get("mine")
    site = probe_site.Site(nodes=probe_site.parse_sinfo(SITE), qos={"normal": 2880})
    lines = command.differences(prof, site)
    for expected in ("partitions.a100.gpus_per_node: profile says 8, the site says 4",
                     "partitions.a100.mem_per_node: profile says 400G, the site says 500G",
                     "partitions.a100.max_time: profile says 4-00:00:00, the site says "
                     "2-00:00:00",
                     "partitions.gone: profile lists it, the site's sinfo shows no such "
                     "partition (or none you may use)",
                     "partition.default: profile says gone, the site says a100",
                     "qos.limits.normal: profile says 1-00:00:00, the site says 2-00:00:00"):
        assert expected in lines, lines
    assert any(line.startswith("partitions.mixed: profile does not list it, the site has it")
               for line in lines), lines
    assert not any("cpus_per_node" in line for line in lines if "a100" in line), lines
    assert "QOS time limits (sacctmgr show qos): normal 2-00:00:00" in command.facts(site)


def test_probe_says_whether_a_job_needs_the_profiles_module_line() -> None:
    found = command.facts(probe_site.Site(apptainer="apptainer version 1.4.5"))
    assert "apptainer version 1.4.5  (apptainer --version): on PATH without modules, so a " \
           "job skips the profile's `modules:` lines" in found, found
    missing = command.facts(probe_site.Site())
    assert "apptainer is not on PATH here: a job runs the profile's `modules:` lines " \
           "(module load apptainer) to find it" in missing, missing


def test_what_could_not_be_read_leaves_the_profile_alone(tmp_path: Path) -> None:
    prof = _profile(tmp_path, MINE).get("mine")
    site = probe_site.Site(unread=["QOS limits: no accounting"])
    assert command.differences(prof, site) == []
    text = "\n".join(command.report(prof, site))
    assert "could not read (the profile's values stay as they are):\n  QOS limits: no " \
           "accounting" in text


def test_write_holds_the_probed_values_each_with_date_and_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TRAIN_CLUSTERS_PATH", raising=False)
    registry = _profile(tmp_path, MINE)
    prof = registry.get("mine")
    site = probe_site.Site(nodes=probe_site.parse_sinfo(SITE), qos={"normal": 2880})
    out = tmp_path / "home" / ".config" / "train" / "clusters" / "mine.yaml"
    # the profile it extends must be found where the written one is read
    out.parent.mkdir(parents=True)
    (out.parent / "base.yaml").write_text(MINE.replace("name: mine", "name: base"))
    prof = Registry(environ={}).get("base")
    out = out.with_name("base.yaml")
    kept = write.write_profile(prof, site, out, when="2026-01-02")
    assert kept is not None and kept.read_text().startswith("name: base")
    text = out.read_text()
    data = yaml.safe_load(text)
    # over what the earlier file extended (a profile cannot extend itself)
    assert (data["name"], data["extends"]) == ("base", "local")
    assert data["partitions"]["a100"] == {
        "gpus_per_node": 4, "gpu_types": ["a100"], "cpus_per_node": 64,
        "mem_per_node": "500G", "max_time": "2-00:00:00", "max_nodes": 2,
        "max_gpus": 16, "cpu_jobs": False, "multi_node_whole": True}
    assert "gone" not in data["partitions"] and data["partition"]["default"] == "a100"
    assert data["qos"]["limits"] == {"normal": "2-00:00:00"}
    for line in text.splitlines():
        if "gpus_per_node" in line or "max_time" in line:
            assert "# 2026-01-02: sinfo -h -N -o" in line, line
        if "max_gpus" in line or "multi_node_whole" in line:
            assert "not probed: kept from" in line, line
    assert "# 2026-01-02: sacctmgr -n -P show qos" in text
    merged = Registry(environ={}).get("base")  # loads, and says what the site says
    assert command.differences(merged, site) == []


def test_write_refuses_a_file_of_another_profile_and_writes_nothing(
        tmp_path: Path) -> None:
    registry = _profile(tmp_path, MINE)
    path = tmp_path / "mine-out.yaml"
    path.write_text("name: other\nextends: local\n")
    site = probe_site.Site(nodes=probe_site.parse_sinfo(SITE))
    with pytest.raises(ConfigError, match="holds another profile"):
        write.write_profile(registry.get("mine"), site, path)
    assert path.read_text() == "name: other\nextends: local\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine-out.yaml", "mine.yaml"]


@pytest.mark.parametrize(("said", "field"), [
    ("sbatch: error: invalid partition specified: big\nallocation failure: Invalid "
     "partition name specified", "partition"),
    ("sbatch: error: Batch job submission failed: Requested node configuration is not "
     "available", "gpus"),
    ("sbatch: error: Invalid generic resource (gres) specification", "gpus"),
    ("allocation failure: Requested time limit is invalid (missing or exceeds some limit)",
     "time"),
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition "
     "combination specified", "account"),
    ("sbatch: error: Batch job submission failed: Invalid qos specification", "qos"),
    ("sbatch: error: Batch job submission failed: Invalid feature specification",
     "constraint"),
    ("sbatch: error: Batch job submission failed: Unable to contact slurm controller "
     "(connect failure)", ""),
])
def test_slurms_refusal_names_the_field_that_produced_it(said: str, field: str) -> None:
    assert testonly.field_of(said) == field


def test_pending_reasons_in_words_and_the_expected_start() -> None:
    assert queue.words("Priority") == ("other jobs come first (higher priority); it "
                                         "starts when its turn comes")
    assert "QOS allows no more GPUs" in str(queue.words("QOSMaxGRESPerUser"))
    assert "chunk before it" in str(queue.words("Dependency"))
    assert queue.words("SomethingNew") == ("Slurm's reason SomethingNew (see `man squeue`, "
                                             "JOB REASON CODES)")
    assert queue.words("None") is None and queue.words(None) is None
    # 22.05 prints a number, 23.02 on {"set", "infinite", "number"}; 0: no estimate
    assert queue.start_seconds(1_800_000_000) == 1_800_000_000
    assert queue.start_seconds({"set": True, "infinite": False,
                                  "number": 1_800_000_000}) == 1_800_000_000
    assert queue.start_seconds({"set": False, "number": 0}) is None
    assert queue.start_seconds(0) is None and queue.start_seconds("soon") is None
    assert queue.expected_start(1_800_007_200, now=1_800_000_000) == (
        "2027-01-15 10:00 UTC (in about 2.0 h)")
    assert queue.expected_start(10**18) is None  # past what gmtime can show


def test_status_of_a_pending_chunk_says_why_and_when() -> None:
    text = json.dumps({"jobs": [
        {"job_id": 7, "job_state": ["PENDING"], "state_reason": "Resources",
         "start_time": {"set": True, "infinite": False, "number": 1_800_007_200}},
        {"job_id": 8, "job_state": "RUNNING", "state_reason": "None",
         "start_time": 1_700_000_000}]})
    states = queue.parse_squeue_json(text)
    assert states["7"]["start"] == 1_800_007_200 and states["8"]["start"] is None
    st: dict[str, Any] = {"name": "w", "cluster": "local", "state": "pending", "run_dir": "/r",
          "cause": "queued", "total": None, "done": None, "warning": None, "gpu": {},
          "chunks_used": 0, "max_chunks": 1, "unit": "chunk",
          "chunks": [{"chunk": 1, "job_id": "7", "state": "PENDING", "reason": "Resources",
                      "expected_start": 1_800_007_200, "events": []}]}
    lines = chainstatus.format_status(st)
    assert "    waiting: it is next, waiting for enough nodes, GPUs or memory to become " \
           "free" in lines, lines
    assert any(line.startswith("    expected start: 2027-01-15 10:00 UTC") for line in lines)
    st["chunks"][0].update(reason="Priority", expected_start=None)
    assert "    expected start: Slurm gives no estimate yet" in chainstatus.format_status(st)


def test_without_slurm_probe_says_what_it_could_not_read_and_write_writes_nothing(
        tmp_path: Path) -> None:
    from tests.conftest import run_cli

    # a PATH with no Slurm and no Apptainer: not a login node
    env = {"HOME": str(tmp_path), "PATH": str(tmp_path / "bin")}
    proc = run_cli(["clusters", "probe", "local"], env=env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "could not read (the profile's values stay as they are):\n  partitions and nodes: " \
           "sinfo is not on PATH\n" in proc.stdout, proc.stdout
    assert "  Apptainer: apptainer is not on PATH\n" in proc.stdout, proc.stdout
    assert "differences" not in proc.stdout, proc.stdout
    proc = run_cli(["clusters", "probe", "local", "--write"], env=env, cwd=tmp_path)
    assert proc.returncode == 3 and "sinfo could not be read" in proc.stderr, proc.stderr
    assert not (tmp_path / ".config").exists()
    proc = run_cli(["clusters", "show", "local", "--write"], env=env, cwd=tmp_path)
    assert proc.returncode == 2 and "--write: only with" in proc.stderr, proc.stderr
    proc = run_cli(["clusters", "probe"], env=env, cwd=tmp_path)
    assert proc.returncode == 2 and "name a profile" in proc.stderr, proc.stderr


def test_a_flooding_sbatch_test_only_is_quoted_as_a_short_tail_without_escapes(
        tmp_path: Path) -> None:
    import os
    import sys

    from tests.conftest import run_cli

    sbin = tmp_path / "sbin"
    sbin.mkdir()
    (sbin / "sbatch").write_text('#!/bin/bash\nhead -c 3000000 /dev/zero | tr "\\000" E >&2\n'
                                 'printf "\\033]0;title\\007\\033[31mdown\\n" >&2\nexit 1\n')
    (sbin / "sbatch").chmod(0o755)
    (tmp_path / "x.py").write_text("")
    proc = run_cli(["submit", "-M", "local", "-e", "command", "--runtime", "none",
                    "--python", sys.executable, "--", sys.executable, str(tmp_path / "x.py")],
                   cwd=tmp_path, env={"PATH": f"{sbin}:{os.environ['PATH']}"})
    assert proc.returncode != 0
    warning = next((ln for ln in proc.stderr.splitlines() if "--test-only" in ln), proc.stderr)
    assert warning.endswith("EEEdown") and len(warning) < 700, warning[-100:]
    assert "\x1b" not in proc.stderr and len(proc.stderr) < 2000, len(proc.stderr)
