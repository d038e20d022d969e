from __future__ import annotations

from pathlib import Path

import pytest

from train.common.errors import ConfigError
from train.common.fields import check_writable_dir, load_yaml
from train.workloads.config import RunConfig, build_config


def test_defaults_are_valid() -> None:
    cfg = RunConfig()
    assert cfg.workload == "demo"
    assert cfg.seeds == (4,)


def test_unknown_key_lists_valid_keys() -> None:
    with pytest.raises(ConfigError) as err:
        build_config({"episodez": 3})
    assert err.value.field == "episodez"
    assert "valid keys are" in str(err.value)
    assert "episodes" in str(err.value) and "batch_size" in str(err.value)


@pytest.mark.parametrize(("values", "field"), [
    ({"episodes": "ten"}, "episodes"),
    ({"episodes": 2.5}, "episodes"),
    ({"episodes": True}, "episodes"),
    ({"lr": "fast"}, "lr"),
    ({"device": "tpu"}, "device"),
    ({"precision": "int8"}, "precision"),
    ({"resume": "sometimes"}, "resume"),
    ({"seeds": [1, "x"]}, "seeds"),
    ({"seeds": []}, "seeds"),
    ({"seeds": [3, 3]}, "seeds"),
    ({"workload": "atari"}, "workload"),
    ({"out": ""}, "out"),
])
def test_wrong_types_and_values_name_the_field(values: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config(values)
    assert err.value.field == field


@pytest.mark.parametrize("name", ["episodes", "batch_size", "episode_steps", "replay_size",
                                  "target_update", "checkpoint_every", "eps_decay_steps"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_zero_or_negative_counts_rejected(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config({}, {name: value})
    assert err.value.field == name
    assert "greater than 0" in str(err.value)


def test_flag_text_is_parsed_and_overrides_file() -> None:
    cfg = build_config({"episodes": 10, "seeds": [1, 2], "lr": 1},
                       {"episodes": "20", "time_budget": "90"})
    assert cfg.episodes == 20
    assert cfg.seeds == (1, 2)
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert cfg.time_budget == 90.0


@pytest.mark.parametrize(("text", "seeds"), [("4 6 8", (4, 6, 8)), ("4,6", (4, 6)),
                                            ("7", (7,))])
def test_seeds_from_text(text: str, seeds: tuple[int, ...]) -> None:
    assert build_config({}, {"seeds": text}).seeds == seeds


def test_non_integer_flag_rejected() -> None:
    with pytest.raises(ConfigError, match="batch_size: must be an integer"):
        build_config({}, {"batch_size": "1e3"})


def test_cross_field_checks() -> None:
    with pytest.raises(ConfigError) as err:
        build_config({"batch_size": 64, "learning_starts": 10})
    assert err.value.field == "learning_starts"
    with pytest.raises(ConfigError) as err:
        build_config({"gamma": 1.5})
    assert err.value.field == "gamma"


def test_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("episodes: 7\nbatch-size: 16\nseeds: 4 6 8\n")
    cfg = build_config(load_yaml(path))
    assert (cfg.episodes, cfg.batch_size, cfg.seeds) == (7, 16, (4, 6, 8))


def test_yaml_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_yaml(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_yaml(tmp_path / "missing.yaml")


def test_unwritable_out(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError) as err:
        check_writable_dir(blocker / "run", "out")
    assert err.value.field == "out"
    assert "not a directory" in str(err.value)
    with pytest.raises(ConfigError, match="out: cannot write"):
        check_writable_dir(Path("/proc/1/run"), "out")
    check_writable_dir(tmp_path / "a" / "b", "out")
    assert not (tmp_path / "a").exists()


def test_identity_excludes_episodes_and_paths() -> None:
    a = RunConfig(episodes=10, out="x")
    b = RunConfig(episodes=20, out="y", time_budget=5.0)
    assert a.identity() == b.identity()
    assert RunConfig(lr=0.1).identity() != a.identity()


def test_unwritable_even_for_root(tmp_path: Path) -> None:
    # /proc accepts access(W_OK) for root but refuses new files
    with pytest.raises(ConfigError, match="results_csv: cannot write"):
        check_writable_dir(Path("/proc/nowhere"), "results_csv")
    check_writable_dir(tmp_path, "out")
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_a_config_file_that_is_not_utf8_is_bad_input(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    bad = tmp_path / "job.yaml"
    bad.write_bytes(b"episodes: 4\nname: \xff\xfe\n")
    proc = run_cli(["render", str(bad), "--", "demo"], cwd=tmp_path)
    assert proc.returncode == 2 and "not UTF-8" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_reader_that_leaves_early_is_no_failure(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)  # `train clusters | head -0`: nobody reads
    try:
        proc = subprocess.run([sys.executable, "-m", "train", "clusters"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
