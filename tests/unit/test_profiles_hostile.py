"""A hostile trial of cluster profiles: every profile string that reaches a rendered job
script or a command line is held to a tight character set, wrong types are ConfigError
(exit 2) naming the field, and nothing is read loosely (a string for a list, "false" for a
boolean, a trailing newline after a name)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from train.cli import main
from train.client.clusters.profiles import Registry
from train.client.clusters.units import parse_mem, parse_time
from train.common import yamlio
from train.common.errors import ConfigError

SHIPPED = Path(__file__).resolve().parents[2] / "src" / "train" / "client" / "clusters" / "data"
LOCAL: dict[str, Any] = yamlio.load_file(SHIPPED / "local.yaml", "profile")
NODE = {"gpus_per_node": 2, "cpus_per_node": 4, "mem_per_node": "8000M", "max_time": "60:00"}
INJECTED = "touch /tmp/pwned"


def _data(**changes: Any) -> dict[str, Any]:
    """The shipped local profile renamed `evil`, with dotted keys set (a.b=value)."""
    data = copy.deepcopy(LOCAL)
    data["name"] = "evil"
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        target = data
        for key in parents:
            target = target.setdefault(key, {})
        target[last] = value
    return data


def _write(tmp_path: Path, data: dict[str, Any] | str) -> Path:
    path = tmp_path / "evil.yaml"
    # JSON is YAML: escapes such as \n reach the loader exactly
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _refused(tmp_path: Path, data: dict[str, Any] | str) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        Registry([_write(tmp_path, data)], environ={})
    return err.value


def _render(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: dict[str, Any],
            capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, data)
    rc = main(["render", "--profile", str(path), "--cluster", "evil", *args, "--", "demo"])
    out, err = capsys.readouterr()
    return rc, out, err


# --- 1. fullmatch: no trailing newline slips through a pattern ------------------------------

@pytest.mark.parametrize("text", ["10\n", "1:00:00\n", "\u0661\u0660", " 10", "10 "])
def test_a_time_with_a_trailing_newline_or_foreign_digits_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="SLURM time"):
        parse_time(text, "default_time")
    assert parse_time("10") == 10


@pytest.mark.parametrize("text", ["8000M\n", "50G\n", "5\u212a", "5\u212aB"])
def test_a_memory_size_with_a_newline_or_a_lookalike_unit_is_refused(text: str) -> None:
    # the Kelvin sign matched [K] under re.I and then failed the unit table (KeyError)
    with pytest.raises(ConfigError, match="memory size"):
        parse_mem(text, "mem_per_node")
    assert parse_mem("50G") == 51200 and parse_mem("8000mb") == 8000


@pytest.mark.parametrize(("changes", "field"), [
    ({"gpu_features": {"a100": "a100\n"}}, "profile evil.gpu_features.a100"),
    ({"env": ["HOME\n"]}, "profile evil.env[0]"),
    ({"env": ["WANDB_*\n"]}, "profile evil.env[0]"),
    ({"nccl_env": {"NCCL_DEBUG\n": "WARN"}}, "profile evil.nccl_env"),
])
def test_a_trailing_newline_after_a_profile_name_is_refused(
        tmp_path: Path, changes: dict[str, Any], field: str) -> None:
    err = _refused(tmp_path, _data(**changes))
    assert err.field == field, str(err)


# --- 2. strings that reach #SBATCH lines or shell lines: a tight character set -------------

HOSTILE = ["a100\n#SBATCH --uid=0", "a100;" + INJECTED, "$(id)", "`id`", "a 100", "a'b",
           'a"b', "a|b", "a&b", "-rf", "x\r"]


@pytest.mark.parametrize("bad", HOSTILE)
@pytest.mark.parametrize(("place", "field"), [
    ("gpu_types", "profile evil.partitions.debug.gpu_types[0]"),
    ("partition", "profile evil.partitions"),
    ("constraint", "profile evil.constraints"),
    ("qos_default", "profile evil.qos.default"),
    ("qos_limit", "profile evil.qos.limits"),
    ("feature_key", "profile evil.gpu_features"),
    ("default_partition", "profile evil.partition.default"),
])
def test_a_profile_name_with_a_newline_or_shell_characters_is_refused(
        tmp_path: Path, bad: str, place: str, field: str) -> None:
    data = {
        "gpu_types": _data(partitions={"debug": {**NODE, "gpu_types": [bad]}}),
        "partition": _data(partitions={bad: NODE}, partition={"default": None}),
        "constraint": _data(constraints={bad: NODE}),
        "qos_default": _data(qos={"default": bad, "limits": {}}),
        "qos_limit": _data(qos={"limits": {bad: "1:00:00"}}),
        "feature_key": _data(gpu_features={bad: "a100"}),
        "default_partition": _data(partition={"default": bad}),
    }[place]
    err = _refused(tmp_path, data)
    assert err.field == field, str(err)
    assert "letters, digits" in str(err)  # says what is allowed
    assert "\n" not in str(err) and "\r" not in str(err)  # the value is quoted escaped


@pytest.mark.parametrize("bad", ["a100\n#SBATCH --uid=0", "h100|a100", "a&b", "$(id)", "a b"])
def test_a_gpu_feature_value_is_one_plain_feature(tmp_path: Path, bad: str) -> None:
    err = _refused(tmp_path, _data(gpu_features={"a100": bad}))
    assert err.field == "profile evil.gpu_features.a100" and "letters, digits" in str(err)


def test_a_gpu_type_with_a_newline_never_reaches_the_script(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    gpu = "a100:1\n#SBATCH --uid=0\n" + INJECTED + "\n#"
    data = _data(gpu_type_request="gres",
                 partitions={"debug": {**NODE, "gpu_types": [gpu]}})
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, data)
    rc = main(["render", "--profile", str(path), "--cluster", "evil", "--gpus-per-node", "1",
               "--gpu-type", gpu, "--", "demo"])
    out, err = capsys.readouterr()
    assert rc == 2, out
    assert INJECTED not in out
    assert "profile evil.partitions.debug.gpu_types[0]" in err


# --- 3. wrong types are ConfigError naming the field, never a traceback ---------------------

@pytest.mark.parametrize(("text", "field"), [
    ("account: 5\n", "profile evil.account"),
    ("account: [required]\n", "profile evil.account"),
    ("partition: [debug]\n", "profile evil.partition"),
    ("partition: {default: [debug]}\n", "profile evil.partition.default"),
    ("partition: {default: {debug: 1}}\n", "profile evil.partition.default"),
    ("qos: {limits: normal}\n", "profile evil.qos.limits"),
    ("qos: {limits: [normal]}\n", "profile evil.qos.limits"),
    ("qos: {default: [normal]}\n", "profile evil.qos.default"),
    ("qos: {limits: {normal: [1]}}\n", "profile evil.qos.limits.normal"),
    ("binds: {/scratch: /scratch}\n", "profile evil.binds"),
    ("modules: {module: load}\n", "profile evil.modules"),
    ("modules: [null]\n", "profile evil.modules[0]"),
    ("binds: [null]\n", "profile evil.binds[0]"),
    ("preempt_flags: [null]\n", "profile evil.preempt_flags[0]"),
    ("env: {HOME: 1}\n", "profile evil.env"),
    ("description: null\n", "profile evil.description"),
    ("description: [a, b]\n", "profile evil.description"),
    ("account: {hint: [slist]}\n", "profile evil.account.hint"),
    ("scratch_root: null\n", "profile evil.scratch_root"),
    ("default_time: null\n", "profile evil.default_time"),
    ("backfill_threshold: [1]\n", "profile evil.backfill_threshold"),
    ("gpu_request: [gres]\n", "profile evil.gpu_request"),
    ("gpu_features: {a100: [a100]}\n", "profile evil.gpu_features.a100"),
    ("partitions: {debug: {gpus_per_node: 2, gpu_types: {a100: 1}, cpus_per_node: 4, "
     "mem_per_node: 8000M, max_time: '60:00'}}\n", "profile evil.partitions.debug.gpu_types"),
    ("partitions: {debug: {gpus_per_node: 2, cpus_per_node: 4, "
     "mem_per_node: [8000M], max_time: '60:00'}}\n",
     "profile evil.partitions.debug.mem_per_node"),
    ("partitions: {debug: {gpus_per_node: null, cpus_per_node: 4, "
     "mem_per_node: 8000M, max_time: '60:00'}}\n",
     "profile evil.partitions.debug.gpus_per_node"),
    ("partitions: {debug: null}\n", "profile evil.partitions.debug"),
    ("partitions: {null: {gpus_per_node: 2, cpus_per_node: 4, mem_per_node: 8000M, "
     "max_time: '60:00'}}\n", "profile evil.partitions"),
])
def test_a_wrong_type_is_a_config_error_naming_the_field(tmp_path: Path, text: str,
                                                         field: str) -> None:
    err = _refused(tmp_path, "name: evil\nextends: local\n" + text)
    assert err.field == field, str(err)
    assert err.exit_code == 2


def test_unknown_keys_of_mixed_types_and_a_list_for_extends_are_config_errors(
        tmp_path: Path) -> None:
    # sorted() of {1, 'zz'} and a list as a dict key were TypeErrors
    err = _refused(tmp_path, "name: evil\nextends: local\n1: x\nzz: y\n")
    assert err.field == "profile evil.1" and "unknown profile key" in str(err)
    err = _refused(tmp_path, "name: evil\nextends: [local]\n")
    assert err.field == "profile evil.extends", str(err)
    err = _refused(tmp_path, "name: [evil]\nextends: local\n")
    assert err.field.endswith(".name"), str(err)


def test_a_wrong_type_exits_2_without_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _render(tmp_path, monkeypatch, _data(account=5), capsys)
    assert rc == 2 and "profile evil.account: must be a mapping" in err


# --- 4. a string where a list belongs is refused, not split into characters ----------------

@pytest.mark.parametrize(("changes", "field"), [
    ({"partitions": {"debug": {**NODE, "gpu_types": "a100"}}},
     "profile evil.partitions.debug.gpu_types"),
    ({"modules": "module load apptainer"}, "profile evil.modules"),
    ({"binds": "/scratch"}, "profile evil.binds"),
    ({"preempt_flags": "--comment=preemption=yes"}, "profile evil.preempt_flags"),
    ({"env": "WANDB_*"}, "profile evil.env"),
])
def test_a_string_for_a_list_is_refused(tmp_path: Path, changes: dict[str, Any],
                                        field: str) -> None:
    err = _refused(tmp_path, _data(**changes))
    assert err.field == field, str(err)
    assert "must be a list" in str(err) and "one-item list" in str(err)


def test_one_item_lists_still_load(tmp_path: Path) -> None:
    data = _data(modules=["module load apptainer"], binds=["/scratch"],
                 partitions={"debug": {**NODE, "gpu_types": ["a100"]}})
    prof = Registry([_write(tmp_path, data)], environ={}).get("evil")
    assert prof.modules == ("module load apptainer",) and prof.binds == ("/scratch",)
    assert prof.partitions["debug"].gpu_types == ("a100",)


# --- 5. booleans are YAML booleans ----------------------------------------------------------

@pytest.mark.parametrize("key", ["account__required", "partition__required",
                                 "partition__allowed", "qos__required"])
@pytest.mark.parametrize("value", ["false", "true", "no", 0, 1, None])
def test_a_boolean_must_be_true_or_false(tmp_path: Path, key: str, value: Any) -> None:
    err = _refused(tmp_path, _data(**{key: value}))
    assert err.field == "profile evil." + key.replace("__", "."), str(err)
    assert "must be true or false" in str(err)


def test_the_string_false_is_not_read_as_true(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"account\.required: must be true or false"):
        Registry([_write(tmp_path, _data(account__required="false"))], environ={})
    prof = Registry([_write(tmp_path, _data(account__required=False))],
                    environ={}).get("evil")
    assert prof.account_required is False


# --- 6. modules: module commands only, names in a tight set ---------------------------------

@pytest.mark.parametrize("line", [
    "module load apptainer; " + INJECTED, "module load $(id)", "module load `id`",
    "module load 'apptainer'", 'module load "apptainer"', "module load apptainer\n" + INJECTED,
    "module load apptainer && " + INJECTED, "module load a|b", "module load ~/x",
    "module load a  b", " module load a", "module", "apptainer", INJECTED,
    "module load a*", "module load ${X}", "module load a>b",
])
def test_a_module_line_that_is_not_a_plain_module_command_is_refused(
        tmp_path: Path, line: str) -> None:
    err = _refused(tmp_path, _data(modules=[line]))
    assert err.field == "profile evil.modules[0]", str(err)
    assert "module load apptainer" in str(err)  # says what is allowed


def test_plain_module_commands_render_verbatim(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    lines = ["module purge", "module load cuda/12.1 gcc@11.2 py-torch+cuda", "ml apptainer"]
    rc, out, err = _render(tmp_path, monkeypatch, _data(modules=lines), capsys,
                           "--runtime", "apptainer", "--image", "x.sif")
    assert rc == 0, err
    # verbatim, in order; the one that loads apptainer only where it is not on PATH
    assert "\nmodule purge\nmodule load cuda/12.1 gcc@11.2 py-torch+cuda\n" in out, out
    assert "if ! command -v apptainer >/dev/null 2>&1; then\n    ml apptainer\nfi" in out


def test_a_module_injection_never_reaches_the_script(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _render(tmp_path, monkeypatch,
                           _data(modules=["module load apptainer\n" + INJECTED]), capsys,
                           "--runtime", "apptainer", "--image", "x.sif")
    assert rc == 2 and INJECTED not in out
    assert "profile evil.modules[0]" in err


# --- other profile strings that reach scripts or command lines ------------------------------

def test_a_profile_name_cannot_break_out_of_the_script_comment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    data = _data()
    data["name"] = "evil\n" + INJECTED
    path = _write(tmp_path, data)
    rc = main(["render", "--profile", str(path), "--cluster", "evil\n" + INJECTED,
               "--", "demo"])
    out, err = capsys.readouterr()
    assert rc == 2 and INJECTED not in out
    assert ".name: must be a profile name" in err


@pytest.mark.parametrize("flag", [
    "--comment=x\n" + INJECTED, "--comment\n" + INJECTED + "=1", "--comment=$(id)",
    "--comment=a b", "--comment='x'", '--comment="x"', "comment=x", "-c", "--",
    "--comment=", "--co;mment=x",
])
def test_a_preempt_flag_is_one_plain_sbatch_option(tmp_path: Path, flag: str) -> None:
    err = _refused(tmp_path, _data(preempt_flags=[flag]))
    assert err.field == "profile evil.preempt_flags[0]", str(err)
    assert "--name=value" in str(err)


def test_a_preempt_flag_cannot_inject_a_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    data = _data(preempt_flags=["--requeue\n" + INJECTED])
    rc, out, err = _render(tmp_path, monkeypatch, data, capsys, "--preempt")
    assert rc == 2 and INJECTED not in out
    assert "profile evil.preempt_flags[0]" in err


@pytest.mark.parametrize("path", ["/scratch,/etc", "/scratch:/mnt", "scratch", "/", "//",
                                  "/scratch\n" + INJECTED, "/$HOME", "/a b", "~/x", ""])
def test_a_profile_bind_is_one_plain_absolute_path(tmp_path: Path, path: str) -> None:
    err = _refused(tmp_path, _data(binds=[path]))
    assert err.field == "profile evil.binds[0]", str(err)


@pytest.mark.parametrize("root", ["scratch", "/scratch/$USER", "/tmp\n" + INJECTED, 5])
def test_scratch_root_is_a_plain_absolute_path(tmp_path: Path, root: Any) -> None:
    err = _refused(tmp_path, _data(scratch_root=root))
    assert err.field == "profile evil.scratch_root", str(err)


@pytest.mark.parametrize(("key", "value"), [("description", "a\nb"),
                                            ("description", "\x1b[2J"),
                                            ("account__hint", "run slist\r")])
def test_text_shown_to_people_holds_no_control_characters(tmp_path: Path, key: str,
                                                          value: str) -> None:
    err = _refused(tmp_path, _data(**{key: value}))
    assert err.field == "profile evil." + key.replace("__", "."), str(err)


@pytest.mark.parametrize(("changes", "field"), [
    ({"default_time": "9" * 5000}, "profile evil.default_time"),
    ({"partitions": {"debug": {**NODE, "mem_per_node": "9" * 5000 + "G"}}},
     "profile evil.partitions.debug.mem_per_node"),
])
def test_a_huge_number_is_a_config_error_quoted_short(tmp_path: Path,
                                                      changes: dict[str, Any],
                                                      field: str) -> None:
    # int() refuses more than 4300 digits with a ValueError
    err = _refused(tmp_path, _data(**changes))
    assert err.field == field and len(str(err)) < 300


def test_the_shipped_profiles_still_load_unchanged() -> None:
    reg = Registry(environ={})
    assert reg.get("gilbreth").modules == ("module load apptainer",)
    assert reg.get("torch").preempt_flags == ("--comment=preemption=yes;requeue=true",)
    assert reg.get("rivanna").partitions["gpu-mig"].gpu_types == ("1g.10gb",)
    assert reg.get("gilbreth").binds == ("/home", "/apps", "/scratch", "/depot")
