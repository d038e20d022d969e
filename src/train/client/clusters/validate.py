"""Validation of one profile mapping (after `extends:` merged it) into a Profile.

Profile values reach every rendered job script (`#SBATCH` lines, shell lines) and command
line: each string is held to a tight character set (no spaces, quotes, `$`, `;`, backticks
or line breaks), each value to its YAML type (a string is not a one-item list, "false" is
not a boolean), and every error is a ConfigError naming the key path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import fields
from typing import Any

from train.client.clusters.schema import (
    DEFAULT_GPU_WATCH,
    GPU_REQUEST_STYLES,
    GPU_TYPE_REQUESTS,
    GpuWatch,
    NodeType,
    Profile,
)
from train.client.clusters.units import parse_mem, parse_time
from train.common.errors import ConfigError
from train.common.yamlio import shown

# Every pattern here is used with fullmatch: `$` would let a trailing newline through.
# Names: profiles, partitions, QOS, GPU types.
NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
NAME_CHARS = "letters, digits, '_', '.' and '-' (not starting with '.' or '-')"
# one node feature (gpu_features values, constraint names): no operators such as & | [ ]
_FEATURE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")
_FEATURE_CHARS = ("letters, digits, '_', '.', ':' and '-' (not starting with '.', ':' or '-'; "
                  "no operators such as & | [ ])")
# absolute paths (binds, scratch_root): no ',' or ':' either (the runtimes split on them)
_PATH_RE = re.compile(r"/[A-Za-z0-9_.+@/-]*")
_PATH_CHARS = "an absolute path of letters, digits, '_', '.', '+', '@', '-' and '/'"
# `modules:` lines run as they are in the job script: `module ...` or `ml ...`, with words
# such as load, cuda/12.1, gcc@11.2, py-torch+cuda
_MODULE_COMMANDS = ("module", "ml")
_MODULE_WORD_RE = re.compile(r"[A-Za-z0-9_./+@:-]+")
_MODULE_CHARS = ("'module' (or 'ml') and words of letters, digits, '_', '.', '/', '+', '@', "
                 "':' and '-' separated by single spaces (no quotes, $, ;, backticks or "
                 "line breaks), such as 'module load apptainer'")
# preempt_flags: one sbatch long option each, --name or --name=value
_FLAG_NAME_RE = re.compile(r"--[A-Za-z][A-Za-z0-9-]*")
_FLAG_VALUE_RE = re.compile(r"[A-Za-z0-9_.,:;=@%/+|&-]+")
_FLAG_CHARS = ("one sbatch option, --name or --name=value: the name letters, digits and '-', "
               "the value letters, digits and _ . , : ; = @ % / + | & - (no spaces, quotes, "
               "$, backticks or line breaks)")
_ENV_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\*?")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_TOP_KEYS = {"name", "description", "extends", "account", "partition", "qos", "gpu_request",
             "gpu_type_request", "gpu_features", "backfill_threshold", "default_time",
             "modules", "binds", "env", "scratch_root", "nccl_env", "preempt_flags", "partitions",
             "constraints", "gpu_watch", "single_host", "max_array_size"}
_SECTION_KEYS = {"account": {"required", "hint", "list_command"},
                 "partition": {"required", "allowed", "default"},
                 "qos": {"required", "default", "limits"}}
_GPU_WATCH_KEYS = tuple(f.name for f in fields(GpuWatch))
_NODE_KEYS = {"gpus_per_node", "gpu_types", "cpus_per_node", "mem_per_node", "max_time",
              "max_nodes", "max_gpus", "driver_version", "cpu_jobs", "multi_node_whole"}
# an NVIDIA driver version as nvidia-smi prints it: 550, 550.54 or 550.54.15
_DRIVER_RE = re.compile(r"[0-9]{1,4}(?:\.[0-9]{1,4}){0,2}")
# one word of a command run without a shell (account.list_command)
_ARGV_WORD_RE = re.compile(r"[A-Za-z0-9_./+@:=,-]+")
_ARGV_CHARS = ("words of letters, digits, '_', '.', '/', '+', '@', ':', '=', ',' and '-' "
               "(run without a shell: no spaces, quotes, $, ;, backticks or line breaks)")
_KEY_LABEL_RE = re.compile(r"[A-Za-z0-9_.:-]+")


def _got(value: Any) -> str:
    return "null" if value is None else shown(value)


def _label(key: Any) -> str:
    """A mapping key as it goes into a field name: plain keys as they are, others quoted."""
    return key if isinstance(key, str) and _KEY_LABEL_RE.fullmatch(key) else shown(key)


def _check_keys(where: str, data: Mapping[Any, Any], allowed: Collection[str]) -> None:
    unknown = sorted((k for k in data if k not in allowed), key=_label)
    if unknown:
        raise ConfigError(f"{where}.{_label(unknown[0])}", "unknown profile key; valid keys "
                          "are: " + ", ".join(sorted(allowed)))


def _section(where: str, value: Any, allowed: Collection[str] | None = None
             ) -> Mapping[Any, Any]:
    """A mapping (null: empty, all defaults); with `allowed`, of those keys only."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        what = ("of names to settings" if allowed is None
                else f"(keys: {', '.join(sorted(allowed))})")
        raise ConfigError(where, f"must be a mapping {what}, got {shown(value)}")
    if allowed is not None:
        _check_keys(where, value, allowed)
    return value


def _list(where: str, value: Any, what: str) -> list[Any]:
    """A YAML list (null: empty). A single string is refused, not split into characters."""
    if value is None:
        return []
    if not isinstance(value, list):
        hint = " (write one item as a one-item list: [ITEM])" if isinstance(value, str) else ""
        raise ConfigError(where, f"must be a list of {what}, got {shown(value)}{hint}")
    return value


def _bool(where: str, section: Mapping[Any, Any], key: str, default: bool) -> bool:
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key}", f"must be true or false, got {_got(value)}")
    return value


def _int(where: str, value: Any, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(where, f"must be a non-negative integer, got {_got(value)}")
    return value


def _text(where: str, value: Any) -> str:
    """Free text (description, hint): shown to people, never run; one plain string."""
    if not isinstance(value, str):
        raise ConfigError(where, f"must be a string, got {_got(value)}")
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in value):
        raise ConfigError(where, "must not hold control characters or line breaks")
    return value


def _matching(where: str, value: Any, pattern: re.Pattern[str], must: str) -> str:
    """A string wholly in `pattern`'s set; `must` says which."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ConfigError(where, f"must be {must}; got {_got(value)}")
    return value


def _word(where: str, value: Any, pattern: re.Pattern[str], what: str, chars: str) -> str:
    """One name or feature (numbers such as 3090 taken as text), in `pattern`'s set."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return _matching(where, str(value) if number else value, pattern, f"{what}: {chars}")


def _name(where: str, value: Any, what: str = "a name") -> str:
    return _word(where, value, NAME_RE, what, NAME_CHARS)


def _items(where: str, value: Any, what: str, check: Callable[[str, Any], str]
           ) -> tuple[str, ...]:
    """A list of `what`, each item through `check` (its field names the item's index)."""
    return tuple(check(f"{where}[{i}]", item)
                 for i, item in enumerate(_list(where, value, what)))


def _keyed(where: str, value: Any, pattern: re.Pattern[str], what: str,
           chars: str) -> dict[str, Any]:
    """A mapping whose keys are names in `pattern`'s set; the key error names the mapping."""
    out: dict[str, Any] = {}
    for raw, item in _section(where, value).items():
        number = isinstance(raw, (int, float)) and not isinstance(raw, bool)
        key = str(raw) if number else raw
        if not isinstance(key, str) or not pattern.fullmatch(key):
            raise ConfigError(where, f"{_got(key)} is not {what}: {chars}")
        out[key] = item
    return out


def _time(where: str, value: Any, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError(where, f"must be a SLURM time such as \"2:00:00\" or \"1-00:00:00\","
                          f" got {_got(value)}")
    return parse_time(value, where)


def _bind(where: str, value: Any) -> str:
    if _matching(where, value, _PATH_RE, _PATH_CHARS).strip("/") == "":
        raise ConfigError(where, "/ would cover the container's whole file system; bind the "
                          "directories the jobs need")
    return str(value)


def _module(where: str, value: Any) -> str:  # run as it is in the script
    words = value.split(" ") if isinstance(value, str) else []
    if len(words) < 2 or words[0] not in _MODULE_COMMANDS \
            or not all(_MODULE_WORD_RE.fullmatch(w) for w in words[1:]):
        raise ConfigError(where, f"must be a module command line: {_MODULE_CHARS}; got "
                          f"{_got(value)}")
    return str(value)


def _preempt_flag(where: str, value: Any) -> str:
    key, sep, flag_value = value.partition("=") if isinstance(value, str) else ("", "", "")
    if not _FLAG_NAME_RE.fullmatch(key) or (sep and not _FLAG_VALUE_RE.fullmatch(flag_value)):
        raise ConfigError(where, f"must be {_FLAG_CHARS}; got {_got(value)}")
    return str(value)


def _env_name(where: str, value: Any) -> str:
    if not isinstance(value, str) or not _ENV_PATTERN.fullmatch(value):
        raise ConfigError(where, f"{_got(value)} is not a variable name or PREFIX_* pattern "
                          "(letters, digits and _, not starting with a digit)")
    return value


def _gpu_watch(where: str, value: Any) -> GpuWatch:
    """A key left out keeps the project's default."""
    value = _section(where, value, _GPU_WATCH_KEYS)
    watch = GpuWatch(**{k: _int(f"{where}.{k}", value.get(k, getattr(DEFAULT_GPU_WATCH, k)))
                        or 0 for k in _GPU_WATCH_KEYS})
    if watch.idle_threshold > 100:
        raise ConfigError(f"{where}.idle_threshold", f"must be a percentage (0 to 100), got "
                          f"{watch.idle_threshold}")
    if watch.idle_minutes == 0:
        raise ConfigError(f"{where}.idle_minutes", "must be at least 1")
    return watch


def _node(where: str, name: str, data: Any) -> NodeType:
    if not isinstance(data, dict):
        raise ConfigError(where, f"must be a mapping, got {_got(data)}")
    _check_keys(where, data, _NODE_KEYS)
    missing = sorted({"gpus_per_node", "cpus_per_node", "mem_per_node", "max_time"}
                     - set(data))
    if missing:
        raise ConfigError(f"{where}.{missing[0]}", "is required")
    mem = data["mem_per_node"]
    if isinstance(mem, bool) or not isinstance(mem, (str, int)):
        raise ConfigError(f"{where}.mem_per_node", f"must be a memory size such as 50G or "
                          f"8000M, got {_got(mem)}")
    return NodeType(
        name=name,
        gpus_per_node=_int(f"{where}.gpus_per_node", data["gpus_per_node"]) or 0,
        gpu_types=_items(f"{where}.gpu_types", data.get("gpu_types"), "GPU types",
                         lambda at, item: _name(at, item, "a GPU type")),
        cpus_per_node=_int(f"{where}.cpus_per_node", data["cpus_per_node"]) or 0,
        mem_mb=parse_mem(mem, f"{where}.mem_per_node"),
        max_minutes=_time(f"{where}.max_time", data["max_time"], optional=True),
        max_nodes=_int(f"{where}.max_nodes", data.get("max_nodes"), optional=True),
        max_gpus=_int(f"{where}.max_gpus", data.get("max_gpus"), optional=True),
        driver_version=None if data.get("driver_version") is None else _word(
            f"{where}.driver_version", data["driver_version"], _DRIVER_RE,
            "an NVIDIA driver version as nvidia-smi prints it", "such as \"550.54.15\" (quoted)"),
        cpu_jobs=_bool(where, data, "cpu_jobs", False),
        multi_node_whole=_bool(where, data, "multi_node_whole", False),
    )


def profile_name(source: str, value: Any) -> str:  # errors under the file it came from
    if value is None or value == "":
        raise ConfigError(f"profile {source}.name", "is required")
    return _name(f"profile {source}.name", value, "a profile name")


def extends_name(name: str, value: Any) -> str:
    return _name(f"profile {name}.extends", value, "the name of a profile")


def _choice(where: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(where, f"must be one of {', '.join(allowed)}; got {_got(value)}")
    return str(value)


def _gpu_request(where: str, data: Mapping[str, Any]) -> tuple[str, str]:
    """gpu_request (how GPUs are counted) and gpu_type_request (how a type is selected)."""
    style = data.get("gpu_request", "gres")
    if style == "gres_typed":
        raise ConfigError(f"{where}.gpu_request", "gres_typed is now two keys: "
                          "gpu_request: gres and gpu_type_request: gres")
    return (_choice(f"{where}.gpu_request", style, GPU_REQUEST_STYLES),
            _choice(f"{where}.gpu_type_request", data.get("gpu_type_request", "none"),
                    GPU_TYPE_REQUESTS))


def _node_types(where: str, data: Mapping[str, Any], partition: Mapping[Any, Any]
                ) -> tuple[dict[str, NodeType], dict[str, NodeType], bool, str | None]:
    """partitions, constraints, and partition.allowed and .default (which need
    partitions)."""
    partitions = {k: _node(f"{where}.partitions.{k}", k, v)
                  for k, v in _keyed(f"{where}.partitions", data.get("partitions"), NAME_RE,
                                     "a partition name", NAME_CHARS).items()}
    constraints = {k: _node(f"{where}.constraints.{k}", k, v)
                   for k, v in _keyed(f"{where}.constraints", data.get("constraints"),
                                      _FEATURE_RE, "a node feature", _FEATURE_CHARS).items()}
    allowed = _bool(f"{where}.partition", partition, "allowed", True)
    if not partitions and not constraints:
        raise ConfigError(f"{where}.partitions", "a profile needs partitions or constraints")
    if allowed and not partitions:
        raise ConfigError(f"{where}.partitions", "needed when partition.allowed is true")
    default = partition.get("default")
    if default is not None:
        default = _name(f"{where}.partition.default", default, "a partition name")
        if default not in partitions:
            raise ConfigError(f"{where}.partition.default", f"{shown(default)} is not one of "
                              f"the partitions: {', '.join(partitions)}")
    return partitions, constraints, allowed, default


def profile_from_dict(data: Mapping[str, Any], source: str) -> Profile:
    """Validate a merged profile mapping; errors name the key path."""
    name = profile_name(source, data.get("name"))
    where = f"profile {name}"
    _check_keys(where, data, _TOP_KEYS)
    account, partition, qos = (_section(f"{where}.{s}", data.get(s), keys)
                               for s, keys in _SECTION_KEYS.items())
    style, type_request = _gpu_request(where, data)
    features = {gpu: _word(f"{where}.gpu_features.{gpu}", feature, _FEATURE_RE,
                           "one node feature name", _FEATURE_CHARS)
                for gpu, feature in _keyed(f"{where}.gpu_features", data.get("gpu_features"),
                                           NAME_RE, "a GPU type", NAME_CHARS).items()}
    partitions, constraints, allowed, default_partition = _node_types(where, data, partition)
    default_qos = qos.get("default")
    if default_qos is not None:
        default_qos = _name(f"{where}.qos.default", default_qos, "a QOS name")
    qos_limits = {k: _time(f"{where}.qos.limits.{k}", v, optional=True)  # null: no limit
                  for k, v in _keyed(f"{where}.qos.limits", qos.get("limits"), NAME_RE,
                                     "a QOS name", NAME_CHARS).items()}
    scratch = data.get("scratch_root", "")  # "": none
    return Profile(
        name=name,
        description=_text(f"{where}.description", data.get("description", "")),
        source=source,
        account_required=_bool(f"{where}.account", account, "required", False),
        account_hint=_text(f"{where}.account.hint", account.get("hint", "")),
        partition_required=_bool(f"{where}.partition", partition, "required", False),
        partitions_allowed=allowed,
        default_partition=default_partition,
        qos_required=_bool(f"{where}.qos", qos, "required", False),
        default_qos=default_qos,
        qos_limits=qos_limits,
        gpu_request=style,
        backfill_minutes=_time(f"{where}.backfill_threshold", data.get("backfill_threshold"),
                               optional=True),
        default_minutes=_time(f"{where}.default_time", data.get("default_time", "1:00:00"))
        or 0,
        modules=_items(f"{where}.modules", data.get("modules"), "module command lines such "
                       "as 'module load apptainer'", _module),
        binds=_items(f"{where}.binds", data.get("binds"), "absolute paths", _bind),
        env=_items(f"{where}.env", data.get("env"), "variable names (NAME or PREFIX_*)",
                   _env_name),
        scratch_root="" if scratch == "" else _matching(f"{where}.scratch_root", scratch,
                                                        _PATH_RE, _PATH_CHARS),
        nccl_env=_nccl_env(f"{where}.nccl_env", data.get("nccl_env")),
        preempt_flags=_items(f"{where}.preempt_flags", data.get("preempt_flags"),
                             "sbatch options", _preempt_flag),
        partitions=partitions,
        constraints=constraints,
        gpu_type_request=type_request,
        gpu_features=features,
        gpu_watch=_gpu_watch(f"{where}.gpu_watch", data.get("gpu_watch")),
        account_list_command=_items(f"{where}.account.list_command",
                                    account.get("list_command"),
                                    "command words such as [slist]", lambda at, word:
                                    _matching(at, word, _ARGV_WORD_RE, _ARGV_CHARS)),
        single_host=_bool(where, data, "single_host", False),
        max_array_size=_array_size(f"{where}.max_array_size", data.get("max_array_size")),
    )


def _array_size(where: str, value: Any) -> int:
    size = Profile.max_array_size if value is None else _int(where, value)
    if size is None or size < 1:
        raise ConfigError(where, f"must be a positive integer, got {_got(value)}")
    return size

def _nccl_env(where: str, value: Any) -> dict[str, str]:
    """NAME: value pairs every job exports (`export NAME=...` in the job script)."""
    out = {}
    for key, item in _keyed(where, value, _ENV_NAME_RE, "an environment variable name",
                            "letters, digits and _, not starting with a digit").items():
        if isinstance(item, (dict, list)) or item is None:
            raise ConfigError(f"{where}.{key}", f"must be a plain value, got {_got(item)}")
        text = str(item).lower() if isinstance(item, bool) else str(item)
        if any(ord(c) < 32 or ord(c) == 127 for c in text):
            raise ConfigError(f"{where}.{key}", "must not hold control characters")
        out[key] = text
    return out
