from __future__ import annotations

from pathlib import Path

import pytest

from train.cli import main
from train.client.clusters.profiles import Registry
from train.client.clusters.units import format_time, parse_mem, parse_time
from train.common.errors import ConfigError, UsageError

SHIPPED = Path(__file__).resolve().parents[2] / "src" / "train" / "client" / "clusters" / "data"


@pytest.mark.parametrize(("text", "minutes"), [("90", 90), ("30:00", 30), ("30:01", 31),
                                               ("2:00:00", 120), ("1-00", 1440),
                                               ("1-02:30", 1590), ("3-00:00:00", 4320)])
def test_parse_time(text: str, minutes: int) -> None:
    assert parse_time(text) == minutes


@pytest.mark.parametrize(("text", "said"), [
    ("1-99:99:99", "99 hours is more than 23"), ("1-24", "24 hours is more than 23"),
    ("2-00:60", "60 minutes is more than 59"), ("1:60:00", "60 minutes is more than 59"),
    ("1:00:60", "60 seconds is more than 59"), ("10:75", "75 seconds is more than 59")])
def test_a_time_field_past_its_unit_is_refused_not_carried_over(
        text: str, said: str, capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """1-99:99:99 was read as 5-04:40:00; only the first number may exceed its unit (90
    minutes, 36:00:00 stay as Slurm reads them)."""
    with pytest.raises(ConfigError, match=f"{said}; a SLURM time is MM, MM:SS, HH:MM:SS"):
        parse_time(text)
    assert parse_time("36:00:00") == 2160 and parse_time("1-23:59:59") == 2880
    monkeypatch.setenv("TRAIN_DEFAULTS", str(tmp_path / "none.yaml"))
    monkeypatch.chdir(tmp_path)
    code = main(["render", "-M", "local", "--runtime", "none", "--python", "python3",
                 "--no-check", "--time", text, "--", "demo"])
    err = capsys.readouterr().err
    assert code == 2 and f"train: error: time: '{text}': {said}" in err, err


def test_time_and_memory_formats() -> None:
    assert format_time(1590) == "1-02:30:00" and format_time(45) == "00:45:00"
    assert parse_mem("50G") == 51200 and parse_mem("8000") == 8000
    assert parse_mem("1T") == 1024 * 1024
    with pytest.raises(ConfigError, match="memory size"):
        parse_mem("lots")
    with pytest.raises(ConfigError, match="SLURM time"):
        parse_time("2h")


def test_shipped_profiles() -> None:
    reg = Registry(environ={})
    assert {"gilbreth", "rivanna", "torch", "local"} <= set(reg.names())
    gil = reg.get("gilbreth")
    assert gil.account_required and "slist" in gil.account_hint
    assert gil.qos_limits["standby"] == 240
    torch_site = reg.get("torch")
    assert not torch_site.partitions_allowed and set(torch_site.constraints) == {"h200",
                                                                                  "l40s"}
    assert torch_site.preempt_flags == ("--comment=preemption=yes;requeue=true",)
    assert torch_site.gpu_type_request == "constraint"
    riv = reg.get("rivanna")
    assert riv.gpu_request == "gres" and riv.gpu_type_request == "gres"
    assert riv.backfill_minutes == 180
    assert riv.partitions["gpu"].max_gpus == 32
    # UVA RC: multi-node jobs take all 8 GPUs of a node; no other shipped node type says so
    assert [n for n, p in riv.partitions.items() if p.multi_node_whole] == ["gpu"]
    assert not any(p.multi_node_whole for p in (*gil.partitions.values(),
                                                 *torch_site.constraints.values()))
    assert gil.gpu_type_request == "constraint" and gil.gpu_feature("h100") == "h100"
    assert reg.get("local").gpu_type_request == "none"


def test_every_site_says_how_it_types_gpus() -> None:
    # a gpu_type must never be dropped: each shipped profile names its way explicitly
    for path in SHIPPED.glob("*.yaml"):
        keys = [ln.split(":")[0] for ln in path.read_text().splitlines()]
        assert "gpu_type_request" in keys, path.name


def test_every_shipped_value_cites_its_source() -> None:
    for path in SHIPPED.glob("*.yaml"):
        lines = path.read_text().splitlines()
        assert lines[0].startswith("#"), path
        for line in lines:
            stripped = line.strip()
            is_value = ":" in stripped and not stripped.endswith(":") \
                and not stripped.startswith(("#", "name:", "description:"))
            if is_value:
                assert "#" in line, f"{path.name}: no source comment on {stripped!r}"


def test_unknown_cluster_lists_known() -> None:
    with pytest.raises(UsageError, match="known clusters: gilbreth, local, rivanna, torch"):
        Registry(environ={}).get("anvil")


def test_user_profile_extends_and_overrides(tmp_path: Path) -> None:
    (tmp_path / "riv.yaml").write_text(
        "name: rivanna\nextends: rivanna\npartition:\n  default: gpu-a100-80\n"
        "partitions:\n  gpu-a100-80:\n    gpus_per_node: 8\n    gpu_types: [a100]\n"
        "    cpus_per_node: 128\n    mem_per_node: 1000G\n    max_time: 3-00:00:00\n")
    reg = Registry(environ={"TRAIN_CLUSTERS_PATH": str(tmp_path)})
    riv = reg.get("rivanna")
    assert list(riv.partitions) == ["gpu-a100-80"]
    assert riv.default_partition == "gpu-a100-80"
    assert riv.account_required  # inherited
    assert riv.source == str(tmp_path / "riv.yaml")


def test_bad_profile_names_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nextends: local\npartitions:\n  p:\n    gpus: 2\n")
    with pytest.raises(ConfigError) as err:
        Registry([bad], environ={})
    assert err.value.field == "profile x.partitions.p.gpus"
    assert "valid keys are" in str(err.value)


def test_clusters_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["clusters"]) == 0
    assert "gilbreth" in capsys.readouterr().out
    assert main(["clusters", "show", "torch"]) == 0
    out = capsys.readouterr().out
    assert "my_slurm_accounts" in out and "l40s" in out
    assert "gpu_type_request" in out and "constraint" in out
    assert main(["clusters", "show", "gilbreth"]) == 0
    assert "gpu_features" in capsys.readouterr().out
    assert main(["clusters", "show", "nowhere"]) == 2


def test_the_shipped_profiles_are_parsed_once_and_each_look_gets_its_own_copy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from train.client.clusters import profiles
    from train.common import yamlio

    profiles._parsed_shipped.cache_clear()
    calls: list[str] = []
    real = yamlio.load_text
    monkeypatch.setattr(yamlio, "load_text", lambda text, source, field: (
        calls.append(source), real(text, source, field))[1])
    first = profiles._shipped()
    first[0][1]["name"] = "changed by a caller"
    second = profiles._shipped()
    assert second[0][1]["name"] != "changed by a caller"
    assert len(calls) == len(first) > 0  # the second look parsed nothing
    assert Registry().get("gilbreth").name == "gilbreth"
