"""The fuzz tier: every parser of outside input (run configs, job specs, cluster profiles,
.def files, a chain's record and Slurm's output) returns, or raises the project's own error;
a ConfigError names its field. Through the CLI, a bad file exits 2 with that message and no
traceback.

Bounded and reproducible: a fixed number of examples per property (derandomize=True: the
same examples every run, no example database), chosen so the file takes seconds.
TRAIN_FUZZ_SCALE=N multiplies every count for a deeper local search (the examples stay
reproducible for a given N).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import re
import signal
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from train.batch import contract, saves
from train.client.clusters import profiles, validate
from train.client.defaults import merged
from train.client.slurm import chain as slurm_chain
from train.client.slurm import chainstatus, queue, sweep
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.render import render
from train.client.slurm.resolve import resolve
from train.common import _proc, yamlio
from train.common.errors import EXIT_USAGE, ConfigError, TrainError
from train.common.fields import build, check_writable_dir, load_yaml
from train.images import defs, lint
from train.workloads.config import MAX_SEED, RunConfig, build_config, run_config_from_argv

_T = TypeVar("_T")
SCALE = max(1, int(os.environ.get("TRAIN_FUZZ_SCALE", "1") or 1))


def fuzz(examples: int) -> Callable[[_T], _T]:
    return settings(max_examples=examples * SCALE, deadline=None, derandomize=True,
                    database=None, suppress_health_check=[HealthCheck.too_slow])


# -- the property ---------------------------------------------------------------------


def clean(call: Callable[..., _T], *args: Any, config_only: bool = False) -> _T | None:
    """call(*args)'s value, or None where it raised the project's error (a ConfigError
    naming its field; with `config_only`, nothing else). Anything else fails the test."""
    try:
        return call(*args)
    except ConfigError as exc:
        assert exc.field.strip(), f"a ConfigError without a field: {exc!r}"
        assert str(exc).startswith(f"{exc.field}: "), f"the message does not name {exc.field!r}"
        assert exc.exit_code == EXIT_USAGE
        return None
    except TrainError as exc:
        if config_only:
            raise AssertionError(f"{type(exc).__name__} where a ConfigError belongs: "
                                 f"{exc}") from exc
        return None


# -- strategies -------------------------------------------------------------------------
# What YAML 1.1 and 1.2 read differently, what a shell or Slurm reads specially, and what
# breaks naive code: special floats, huge integers, NUL, line breaks, non-ASCII digits.
SPECIAL = [
    "1:00:00", "60:00", "1-00:00:00", "99:99:99", "0", "-1", "+1", "-0", "1e-3", "1E3",
    "5.0e-4", "1.", ".5", "0x1F", "0o17", "010", "0b11", "1_000", "9" * 40, "9" * 5000,
    "nan", ".nan", "NaN", ".inf", "-.inf", "inf", "1e999", "~", "null", "Null", "yes", "no",
    "on", "off", "y", "true", "False", "&a", "*a", "!!python/object:os.system",
    "!!binary aGk=", "", " ", "\0", "\n", "a\nb", "a\rb", "\t", "\x85", "\u2028", "é",
    "\U0001f600", "\u00b2", "\u0663", "--", "-", "%", "{{ x }}", "$(id)", "'", '"', "#",
    "a: b", "- x", "[", "{", "?", "|", ">", "@", "`", "50G", "0G", "0", "8000M", "1K",
    "1" + "0" * 400 + "K", "USR1", "TERM", "none", "auto", "demo", "sc2", "train",
    "command", "navsim", "apptainer", "docker", "--episodes", "--out=x", "--time-budget",
    "NAME=value", "PATH=/x", "A=\0", "WANDB_API_KEY=x", "/tmp", "../x", "/", "a:b:ro",
    "/tmp:/x:ro", "--reservation=r", "--gres=gpu:1", "--x", "debug", "a100", "h200|l40s",
]
_MAX_INTS = [0, 1, -1, 4, 2**31, 2**63, 10**400, -(10**400), MAX_SEED, MAX_SEED + 1]

texts = st.one_of(st.sampled_from(SPECIAL), st.text(max_size=12))
ints = st.one_of(st.integers(-3, 64), st.integers(), st.sampled_from(_MAX_INTS))


def _nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=3)


# what a YAML file can hold: scalars (non-finite floats too), lists, mappings
values = st.recursive(st.one_of(st.none(), st.booleans(), ints, st.floats(), texts),
                      _nested, max_leaves=8)
# what a JSON file can hold
json_values = st.recursive(st.one_of(st.none(), st.booleans(), ints,
                                     st.floats(allow_nan=False, allow_infinity=False), texts),
                           _nested, max_leaves=10)


def keyed(names: list[str]) -> st.SearchStrategy[dict[Any, Any]]:
    """Mappings whose keys are mostly field names (some spelled with '-'), some not."""
    known = names + [n.replace("_", "-") for n in names if "_" in n]
    keys = st.one_of(st.sampled_from(known), st.sampled_from(known), texts, ints,
                     st.none(), st.booleans())
    return st.dictionaries(keys, values, max_size=6)


def yaml_scalars() -> st.SearchStrategy[str]:
    """Scalars as written in a YAML file: plain, quoted, tagged, anchored, escaped."""
    plain = st.sampled_from([s for s in SPECIAL if "\n" not in s and "\0" not in s])
    return st.one_of(
        plain,
        st.builds(json.dumps, texts),  # double-quoted, with escapes (\0, \n, \ud800)
        st.sampled_from(['"\\ud800"', '"\\udfff x"', "'it''s'", "!!str 5", "!!int x",
                         "!!float 1", "!!float ''", "!!bool 2", "!!set {a}", "!!omap [a: 1]",
                         "!!timestamp 2001-12-14", "!!timestamp x", "2001-12-14", "!!null ''",
                         "!!python/name:os.system", "&a [1, 2]", "*a", "*nope", "[*a, *a]",
                         "{a: 1, a: 2}", "[1, [2, [3]]]", "{? [a]: 1}", "<<", "|\n  text",
                         ">-\n  folded", "!local x", "? x", "\t1", "=", "-- 1"]),
        st.builds(lambda a, b: f"[{a}, {b}]", plain, plain),
    )


def yaml_documents(names: list[str]) -> st.SearchStrategy[str]:
    """YAML text: `key: value` lines over field names and odd keys, with document-level
    oddities mixed in (directives, anchors, merges, tabs, a BOM, deep nesting)."""
    keys = st.one_of(st.sampled_from(names), st.sampled_from(names), st.sampled_from(SPECIAL),
                     st.text(alphabet="abcdefgh_-:#&*!? ", max_size=8))
    line = st.one_of(
        st.builds(lambda k, v: f"{k}: {v}", keys, yaml_scalars()),
        st.builds(lambda k, v: f"{k}:\n  - {v}\n  - {v}", keys, yaml_scalars()),
        st.sampled_from(["%YAML 1.2\n---", "---", "...", "--- !!python/object/apply:os."
                         "system ['true']", "a: &a [*a]", "b: &b {x: 1}\nc:\n  <<: *b",
                         "\ufeffname: x", "\tname: x", "- x", "? [a, b]\n: 1", "[" * 200,
                         "x: " + "[" * 60 + "]" * 60, "%TAG ! tag:x,2000:\n---", "{", "}",
                         "k: \0", "k: \x85", "\x00", "# comment", ""]),
    )
    return st.builds("\n".join, st.lists(line, max_size=6))


RUN_FIELDS = [f.name for f in fields(RunConfig)]
JOB_FIELDS = [f.name for f in fields(JobSpec)]
SHIPPED = profiles.Registry(environ={})


def _site_words() -> list[str]:
    """Partition, constraint, QOS and GPU type names of the shipped profiles."""
    words: set[str] = set()
    for name in SHIPPED.names():
        prof = SHIPPED.get(name)
        words |= {name, *prof.partitions, *prof.constraints, *prof.qos_limits}
        for node in [*prof.partitions.values(), *prof.constraints.values()]:
            words |= set(node.gpu_types)
    return sorted(words)


SITE = _site_words()
LONG = "/tmp/" + "a" * 300  # a name longer than a file system takes: OSError, not ENOENT
# Values each job field takes, right and nearly right, beside SPECIAL and random text.
JOB_TEXT: dict[str, list[str]] = {
    "time": ["1:00:00", "10:00", "60", "0", "0:30", "1-00:00:00", "2-00", "99:99:99",
             "1:00:00\n", " 1:00", "9" * 30],
    "mem": ["0", "50G", "1K", "8000M", "4G", "1T", "0G", "1g", "9" * 30 + "T"],
    "worker_mem": ["0", "4G", "1K", "64T", "x"],
    "partition": SITE, "qos": SITE, "gpu_type": SITE, "cluster": SITE,
    "constraint": [*SITE, "|".join(SITE[:3]), "&".join(SITE[:2]), "a|", "[a*2]"],
    "account": ["acct", "a b", "a\nb"],
    "workload": ["demo", "sc2", "--episodes", "3", "--out", "--out=x", "--time-budget=5",
                 "python", "train.py", "--config", "/dev/zero", "--lr", "nan",
                 "train_test_split=x", "+trainer.params.strategy=ddp", ""],
    "image": ["img.sif", "x:1", ""], "out": ["runs/x", "/", "/tmp/x", "", "a\nb", ".", LONG],
    "python": ["python3", "", "py thon"],
    "env": ["A=1", "WANDB_API_KEY", "PATH=/x", "A\n", "1A=2", "TOKEN=abc", "A=\0", "X",
            "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123", "A=$(id)"],
    "bind": ["/tmp", "/tmp:/x", "/tmp:/x:ro", "/tmp:/x:rw:z", "/nonexistent", "a,b",
             "/tmp:rel", ".", ":", "/tmp:/", "/tmp::ro", LONG],
    "data": ["/tmp", "/nonexistent", ".", LONG], "navsim_split": ["navtrain", "x\n", "a b"],
    "navsim_script": ["/x.py", "rel.py", "/a\nb"],
    "sbatch_extra": ["--reservation=r", "--mail-type=END", "--time=1", "--ti", "-x",
                     "--a b", "--exclude=n1", "--", "--gres=gpu:1"],
    "srun_extra": ["--mpi=none", "--jobid=1", "--kill-on-bad-exit", "--cpu-bind=x"],
    "sweep_seeds": ["4 6 8", "4,4", "-1", "x"],
    "name": ["job", "a" * 65, "-x", "x\n", "a.b_c-d"],
}


def field_values(cls: type[Any], words: dict[str, list[str]]) -> st.SearchStrategy[Any]:
    """Mappings of a few fields of `cls`, each value mostly of its field's kind (so the
    checks behind the type checks run too), sometimes anything."""
    per: dict[str, st.SearchStrategy[Any]] = {}
    for f in fields(cls):
        meta = f.metadata
        text = st.one_of(st.sampled_from([*(meta["choices"] or ()), *words.get(f.name, ())]
                                         or SPECIAL), texts)
        kind = {int: ints, float: st.one_of(st.floats(), ints), bool: st.booleans(),
                tuple: st.one_of(st.lists(ints, max_size=3), text),
                list: st.lists(text, max_size=3), str: text}[meta["kind"]]
        per[f.name] = st.one_of(kind, kind, kind, values)
    pairs = st.sampled_from(sorted(per)).flatmap(
        lambda name: st.tuples(st.just(name), per[name]))
    return st.lists(pairs, max_size=5).map(dict)


def flag_texts(cls: type[Any], words: dict[str, list[str]]) -> st.SearchStrategy[Any]:
    """A few flags of `cls` as the CLI hands them over: text, a list of texts for the
    fields that repeat, "true"/"false" for switches."""
    per: dict[str, st.SearchStrategy[Any]] = {}
    for f in fields(cls):
        meta = f.metadata
        text = st.one_of(st.sampled_from([*(meta["choices"] or ()), *words.get(f.name, ())]
                                         or SPECIAL), texts, ints.map(str))
        per[f.name] = {list: st.lists(text, min_size=1, max_size=3),
                       bool: st.sampled_from(["true", "false"])}.get(meta["kind"], text)
    pairs = st.sampled_from(sorted(per)).flatmap(
        lambda name: st.tuples(st.just(name), per[name]))
    return st.lists(pairs, max_size=3).map(dict)


@contextlib.contextmanager
def written(text: str | bytes, name: str = "file.yaml") -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        if isinstance(text, str):
            path.write_text(text, encoding="utf-8", errors="surrogatepass")
        else:
            path.write_bytes(text)
        yield path


# -- run config -------------------------------------------------------------------------


@fuzz(100)
@given(field_values(RunConfig, {}), flag_texts(RunConfig, {}))
def test_run_config_from_mappings_and_flags(data: dict[str, Any], flags: dict[str, Any]
                                            ) -> None:
    clean(build_config, data, flags, config_only=True)


@fuzz(300)
@given(st.one_of(field_values(RunConfig, {}), keyed(RUN_FIELDS)))
@example({"": None})  # an empty key: the error's field was empty
@example({"lr": 10**400})  # an integer past the largest float: OverflowError
@example({"seeds": "1" * 5000})  # past int()'s 4300 digits: ValueError
def test_run_config_from_mappings(data: dict[Any, Any]) -> None:
    cfg = clean(build_config, data, config_only=True)
    if cfg is not None:
        assert isinstance(cfg, RunConfig)


@fuzz(150)
@given(yaml_documents(RUN_FIELDS))
@example("lr: !!bool 2")  # PyYAML's own KeyError
@example("lr: !!float ''")  # IndexError
@example("lr: !!timestamp x")  # AttributeError
@example('out: "\\ud800"')  # a lone surrogate: a traceback where it is written out
def test_run_config_from_yaml_text(text: str) -> None:
    def load() -> RunConfig:
        with written(text) as path:
            return build_config(load_yaml(path))

    clean(load, config_only=True)


_FLAG_WORDS = [*("--" + n.replace("_", "-") for n in RUN_FIELDS), "--config", "demo",
               "sc2", "--", "-x", "--no-such-flag", "--lr=1e-3", "--seeds=4,4"]


@fuzz(200)
@given(st.lists(st.one_of(st.sampled_from(_FLAG_WORDS), texts), max_size=8))
@example(["--episodes", "1" * 5000])  # past int()'s 4300 digits: ValueError
def test_run_config_from_argv(argv: list[str]) -> None:
    clean(lambda: run_config_from_argv(argv))


@fuzz(60)
@given(st.lists(st.one_of(st.sampled_from(["a" * 300, "x\0y", "new", "", " "]),
                          texts.filter(lambda t: "/" not in t and t != "..")),
                min_size=1, max_size=3))
@example(["a" * 300])  # OSError: File name too long
def test_run_directory_check(parts: list[str]) -> None:
    """`train run`'s check of --out and --results-csv (nothing is created but a probe
    file in the nearest existing folder, here a temporary one)."""
    with tempfile.TemporaryDirectory() as tmp:
        clean(check_writable_dir, Path(tmp).joinpath(*parts), "out", config_only=True)


@fuzz(60)
@given(st.binary(max_size=200))
def test_yaml_bytes(raw: bytes) -> None:
    with written(raw) as path:
        clean(lambda: yamlio.load_file(path, "config"), config_only=True)


# -- job spec -----------------------------------------------------------------------------


def base_job(cluster: str) -> dict[str, Any]:
    """A job the cluster accepts as it is: what its profile requires, and no more."""
    prof = SHIPPED.get(cluster)
    base: dict[str, Any] = {"account": "acct"} if prof.account_required else {}
    if not prof.partitions_allowed:
        base["constraint"] = next(iter(prof.constraints))
    elif prof.default_partition is None:
        base["partition"] = next(iter(prof.partitions))
    if prof.qos_required and not prof.default_qos:
        base["qos"] = next(iter(prof.qos_limits))
    node = (prof.constraints[base["constraint"]] if "constraint" in base
            else prof.partitions[base.get("partition") or prof.default_partition or ""])
    if node.gpus_per_node and not node.cpu_jobs:  # a GPU node runs GPU jobs only
        base["gpus_per_node"] = 1
    base["runtime"] = "none"  # (`train run` needs torch: an image, or the nodes' own)
    return base


def test_each_base_job_resolves() -> None:
    for cluster in SHIPPED.names():
        resolve(build(JobSpec, base_job(cluster), {}), SHIPPED.get(cluster))


@fuzz(300)
@given(st.one_of(field_values(JobSpec, JOB_TEXT), field_values(JobSpec, JOB_TEXT),
                 keyed(JOB_FIELDS)), flag_texts(JobSpec, JOB_TEXT),
       st.sampled_from(SHIPPED.names()), st.booleans())
@example({"workload": ["demo", "--bogus"]}, {}, "local", False)  # an argparse UsageError
@example({}, {"time": "1" * 5000, "mem": "1" + "0" * 400 + "K"}, "local", False)
def test_job_spec_and_resolve(data: dict[Any, Any], flags: dict[str, Any], cluster: str,
                              on_base: bool) -> None:
    """A few fields and flags over a job the cluster accepts (or over nothing), resolved
    against a shipped profile, and rendered where that succeeds."""
    if on_base:
        data = {**base_job(cluster), **data}
    spec = clean(build, JobSpec, data, flags, config_only=True)
    if spec is None:
        return
    specs = [spec]
    if spec.sweep_seeds:  # one job per seed, as `train render` and `train submit` make them
        split = clean(sweep.split, spec, config_only=True)
        specs = [one for _seed, one in split[1]] if split else []
    for one in specs:
        job = clean(resolve, one, SHIPPED.get(cluster), config_only=True)
        if job is not None:
            clean(render, job, config_only=True)


@fuzz(150)
@given(yaml_documents(JOB_FIELDS), st.sampled_from(SHIPPED.names()))
def test_job_spec_from_yaml_text(text: str, cluster: str) -> None:
    def load() -> Any:
        with written(text) as path:
            return resolve(build(JobSpec, load_yaml(path), {}), SHIPPED.get(cluster))

    clean(load, config_only=True)


# -- cluster profiles -----------------------------------------------------------------------
def _shipped_profiles() -> list[dict[str, Any]]:
    folder = resources.files("train.client.clusters") / "data"
    return [yamlio.load_text(entry.read_text(encoding="utf-8"), entry.name, "profile")
            for entry in sorted(folder.iterdir(), key=lambda e: e.name)
            if entry.name.endswith(".yaml")]


SHIPPED_DATA = _shipped_profiles()


def _key_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every key of nested mappings."""
    if not isinstance(node, dict):
        return []
    return [p for key, value in node.items()
            for p in [(*prefix, key), *_key_paths(value, (*prefix, key))]]


PROFILE_KEYS = sorted({str(p[-1]) for data in SHIPPED_DATA for p in _key_paths(data)})


@fuzz(200)
@given(st.dictionaries(st.one_of(st.sampled_from(PROFILE_KEYS), texts), values, max_size=8)
       .map(lambda d: {"name": "fuzz", **d}))
def test_profile_from_mappings(data: dict[Any, Any]) -> None:
    clean(lambda: validate.profile_from_dict(data, "fuzz"), config_only=True)


@st.composite
def mutated_profiles(draw: st.DrawFn) -> dict[str, Any]:
    """A shipped profile with a few keys (at any depth) set to a new value, removed, or
    added beside them."""
    data: dict[str, Any] = copy.deepcopy(draw(st.sampled_from(SHIPPED_DATA)))
    for _ in range(draw(st.integers(1, 3))):
        paths = _key_paths(data)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = data
        for key in path[:-1]:
            parent = parent[key]
        edit = draw(st.sampled_from(["set", "set", "delete", "add"]))
        if edit == "set":
            parent[path[-1]] = draw(st.one_of(values, texts, ints))
        elif edit == "delete":
            del parent[path[-1]]
        else:
            parent[draw(st.one_of(st.sampled_from(PROFILE_KEYS), texts))] = draw(values)
    return data


@fuzz(300)
@given(mutated_profiles())
def test_profile_mutations(data: dict[str, Any]) -> None:
    clean(lambda: validate.profile_from_dict(data, "fuzz"), config_only=True)


@fuzz(100)
@given(yaml_documents(PROFILE_KEYS))
def test_profile_from_yaml_text(text: str) -> None:
    def load() -> Any:
        with written(text) as path:
            return profiles.Registry(extra_files=[path], environ={})

    clean(load, config_only=True)


# -- .def files ---------------------------------------------------------------------------
_HEADER = ["Bootstrap: docker", "Bootstrap: localimage", "Bootstrap: Docker",
           "From: ubuntu:22.04", "From: ubuntu", "From: {{ base }}", "From: base.sif",
           "From: " + "b" * 300 + ".sif", "Stage: one", "Target: x", "OSVersion: 1 \\",
           "no colon", "# comment", "", "Bootstrap: docker # c", "otherurl3: x"]
_SECTIONS = ["%post", "%files", "%files from build", "%files # c", "%environment",
             "%arguments", "%test", "%runscript", "%labels", "%help", "%setup", "%pre",
             "%startscript", "%appinstall app", "%apprun", "%APPRUN x", "%app", "  %post",
             "%POST", "%post -c /bin/bash", "%%post", "%post2", "%"]
_BODY = ["set -e", "set -eu", "exec python \"$@\"", "python -c 1", "echo {{ base }}",
         "echo {{ nope }}", "echo x # {{ base }}", "base=ubuntu:22.04", "base=", "x=a=b",
         'x="q"', "1x=2", "pip install torch", "pip install --require-hashes -r",
         "pip install --require-hashes -r lock.txt", "pip install --require-hashes -r "
         "bad.txt", "pip install --no-index --no-deps .", "export PYTORCH_CUDA_ALLOC_CONF="
         "expandable_segments:True", "src dst", "src", '"a b" /c', "'a b' c", "../x /y",
         "/abs /y", "a*b /y", "$HOME /y", "~ /y", "dir /opt", "dir /opt/", "a b c",
         "x" * 300 + " /y", "pyproject.toml /p", "", "   ", "\t# c", "line \\", "\x01",
         "{{", "}}", "{{ base }} {{ base }}", "Author me", "%notasection"]


_GOOD_DEF = [
    "Bootstrap: docker", "From: {{ base }}", "%arguments", "    base=ubuntu:22.04",
    "%files", "    src /opt/src", "    dir /opt/dir", "%environment",
    "    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,garbage_collection_"
    "threshold:0.7,max_split_size_mb:128", "%post", "    set -e",
    "    pip install --require-hashes -r lock.txt", "%runscript", '    exec python "$@"',
    "%test", "    set -e", "    python -c 1", "%labels", "    Author me", "%help",
    "    Help.",
]
_DEF_LINES = st.one_of(st.sampled_from(_HEADER + _SECTIONS + _BODY),
                       st.sampled_from(_BODY).map(lambda line: "    " + line),
                       st.text(max_size=20))


@st.composite
def def_texts(draw: st.DrawFn) -> bytes:
    """A definition that passes lint with a few lines replaced, inserted or removed, or
    one put together from random headers, sections and lines; sometimes bytes spliced in
    (a CR, NUL, non-UTF-8)."""
    if draw(st.booleans()):
        lines = list(_GOOD_DEF)
        if draw(st.booleans()):
            lines[1] = draw(st.sampled_from(_HEADER))
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(lines)))
            edit = draw(st.sampled_from(["replace", "insert", "delete"]))
            if edit == "insert" or at == len(lines):
                lines.insert(at, draw(_DEF_LINES))
            elif edit == "replace":
                lines[at] = draw(_DEF_LINES)
            else:
                del lines[at]
    else:
        lines = draw(st.lists(st.sampled_from(_HEADER), max_size=4))
        if draw(st.booleans()):
            lines = ["Bootstrap: docker", "From: ubuntu:22.04", *lines]
        for _ in range(draw(st.integers(0, 5))):
            lines.append(draw(st.sampled_from(_SECTIONS)))
            lines += draw(st.lists(_DEF_LINES, max_size=4))
    text = draw(st.sampled_from(["\n", "\r\n"])).join(lines)
    raw = text.encode("utf-8", errors="surrogatepass")
    if draw(st.integers(0, 3)) == 0:
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(max_size=6)) + raw[at:]
    return raw


@pytest.fixture(scope="module")
def def_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository-like root: pyproject.toml, files to copy, locks, and a base .def."""
    root = tmp_path_factory.mktemp("repo")
    (root / "pyproject.toml").write_text("[project]\n")
    (root / "src").write_text("x")
    (root / "dir").mkdir()
    (root / "containers" / "requirements").mkdir(parents=True)
    (root / "containers" / "requirements" / "lock.txt").write_text("a==1 --hash=sha256:0\n")
    (root / "containers" / "requirements" / "bad.txt").write_bytes(b"\xff\xfe\n")
    (root / "containers" / "base.def").write_text(
        "Bootstrap: docker\nFrom: ubuntu:22.04\n%files\n    dir /opt/dir\n")
    return root


_POST = b"Bootstrap: docker\nFrom: ubuntu:22.04\n%post\n"


@fuzz(200)
@given(def_texts())
@example(raw=_POST + b"pip install --require-hashes -r")  # IndexError
@example(raw=_POST + b"pip install --require-hashes -r bad.txt")  # UnicodeDecodeError
@example(raw=_POST.replace(b"%post", b"%files") + b"x" * 300 + b" /y")  # name too long
@example(raw=b"Bootstrap: localimage\nFrom: " + b"b" * 300 + b".sif\n")  # name too long
def test_def_parser_and_lint(def_tree: Path, raw: bytes) -> None:
    path = def_tree / "containers" / "fuzz.def"
    path.write_bytes(raw)
    clean(lambda: defs.parse(path))
    violations = lint.lint_def(path, reference=False)
    assert all(v.rule and v.line >= 1 for v in violations)


@fuzz(40)
@given(def_texts())
def test_def_lint_with_spython(def_tree: Path, raw: bytes) -> None:
    path = def_tree / "containers" / "fuzz-ref.def"
    path.write_bytes(raw)
    lint.lint_def(path, reference=True)


@fuzz(60)
@given(st.binary(max_size=300))
def test_def_random_bytes(def_tree: Path, raw: bytes) -> None:
    path = def_tree / "containers" / "bytes.def"
    path.write_bytes(b"Bootstrap: docker\nFrom: x:1.0\n" + raw)
    clean(lambda: defs.parse(path))
    lint.lint_def(path, reference=False)


# -- a chain's record and Slurm's output -----------------------------------------------------
_RECORD_KEYS = ["name", "cluster", "max_chunks", "requeue", "walltime_seconds",
                "time_budget_seconds", "signal_margin", "first_job", "entry"]
_EVENT_WORDS = [*contract.EVENTS, "junk"]
_DIGITS = st.one_of(st.integers(0, 99).map(str), st.sampled_from(["\u00b2", "\u0663",
                                                                  "9" * 5000, "-1", "1.5"]))


@st.composite
def event_lines(draw: st.DrawFn) -> str:
    parts = [draw(_DIGITS), draw(_DIGITS), draw(st.sampled_from(["10", "11", "12"])),
             draw(st.sampled_from(_EVENT_WORDS))]
    parts += draw(st.lists(st.one_of(_DIGITS, texts), max_size=3))
    return " ".join(parts)


@fuzz(200)
@given(st.one_of(st.dictionaries(st.sampled_from(_RECORD_KEYS), json_values, max_size=8)
                 .map(lambda d: {"name": "n", **d}), json_values).map(json.dumps),
       st.lists(st.tuples(_DIGITS, st.sampled_from(["10", "11", "12", "x", "\u00b2"]))
                .map(" ".join), max_size=4).map("\n".join),
       st.lists(st.one_of(event_lines(), texts), max_size=6).map("\n".join),
       # '\u00b2 3' ('²'.isdigit() but int('²') fails), 5000 digits, text and junk
       st.one_of(st.none(), st.sampled_from(["5 10", "10 10", "0 0", "x", "1 2 3", "",
                                             "\u00b2 3", "9" * 5000 + " 1"]), texts),
       st.dictionaries(st.sampled_from(["10", "11", "12"]),
                       st.sampled_from([*queue.ACTIVE_STATES, "COMPLETED", "FAILED",
                                        "CANCELLED", "TIMEOUT", "UNKNOWN", "JobHeldUser"]),
                       max_size=3))
@example(record='{"name": "n", "max_chunks": "x", "time_budget_seconds": [1]}',  # int([1])
         ids="1 10\n\u00b2 11",  # '²'.isdigit(), int('²') a ValueError
         events="100 1 10 started 0 0 10\n200 1 10 stopped 5 10\n"
                + "9" * 5000 + " 1 10 started",  # past int()'s 4300 digits
         progress="\u00b2 3", states={"10": "RUNNING"})
def test_chain_record_and_status(record: str, ids: str, events: str, progress: str | None,
                                 states: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        (run / contract.CHAIN_RECORD).write_text(record, encoding="utf-8")
        (run / contract.CHAIN_IDS).write_text(ids, encoding="utf-8")
        (run / contract.CHAIN_EVENTS).write_text(events, encoding="utf-8")
        if progress is not None:  # and bytes that are not UTF-8 (surrogate escapes)
            (run / contract.PROGRESS_FILE).write_bytes(
                progress.encode("utf-8", "surrogateescape") + b"\xff")
        chain = clean(lambda: slurm_chain.load_chain(run))
        if chain is None:
            return
        answer = {i: {"state": states.get(i, "UNKNOWN"), "reason": states.get(i)}
                  for i in chain.ids}
        with mock.patch.object(queue, "job_states", lambda ids: answer):
            status = chainstatus.chain_status(chain)
        assert chainstatus.format_status(status)


@fuzz(60)
@given(st.one_of(st.binary(max_size=100), st.sampled_from([b"[" * 100_000, b"{" * 5000,
                                                          b'{"name": "\xff"}'])))
@example(b"[" * 100_000)  # RecursionError
def test_chain_record_bytes(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / contract.CHAIN_RECORD).write_bytes(raw)
        clean(lambda: slurm_chain.load_chain(Path(tmp)))


@fuzz(60)
@given(st.one_of(texts, st.sampled_from(["run", "10", "11", "run/seed-4", "a" * 300,
                                         "x/" + "a" * 300, "\u00b2"])), st.booleans())
@example("a" * 300, True)  # OSError: File name too long
@example("x/" + "a" * 300, False)
def test_find_run(ref: str, long_root: bool) -> None:
    """`train status/logs/cancel REF [--runs DIR]`: a run by name, path or job id."""
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / ("a" * 300 if long_root else "runs")
        if not long_root:
            (runs / "run").mkdir(parents=True)
            (runs / "run" / contract.CHAIN_RECORD).write_text('{"name": "run"}')
            (runs / "run" / contract.CHAIN_IDS).write_text("1 10\n")
        found = clean(slurm_chain.find_run, ref, runs)
        assert found is None or found == runs / "run" or "/" in ref


slurm_text = st.one_of(
    texts, st.text(max_size=80),
    st.lists(st.lists(st.one_of(_DIGITS, texts, st.sampled_from(["", " ", "123_4", "1.batch",
                                                                 "CANCELLED by 0", "0:0"])),
                      max_size=4).map("|".join), max_size=4).map("\n".join))


@fuzz(200)
@given(slurm_text)
@example("123| |0")  # a blank state: IndexError
@example("\u00b2 5\n\u00b2")  # '²'.isdigit(), but int('²') is a ValueError
def test_text_parsers(text: str) -> None:
    assert all(k.isascii() and k.isdigit() for k in queue.parse_sacct(text))
    ids = saves.parse_ids(text)  # a job id, or a sweep task's ARRAY_TASK
    assert all(n > 0 and re.fullmatch(r"[0-9]+(_[0-9]+)?", i) for n, i in ids)
    assert all(isinstance(e["time"], int) for e in slurm_chain.parse_events(text))
    job_id = clean(queue.parse_sbatch_id, text)
    assert job_id is None or (job_id.isascii() and job_id.isdigit())


_JOB = st.fixed_dictionaries({}, optional={
    "job_id": st.one_of(json_values, st.fixed_dictionaries(
        {"set": st.booleans()}, optional={"number": json_values})),
    "job_state": json_values, "state_reason": json_values, "nodes": json_values})


@fuzz(150)
@given(st.one_of(
    json_values.map(json.dumps),
    st.lists(st.one_of(_JOB, json_values), max_size=3).map(lambda j: json.dumps({"jobs": j})),
    st.sampled_from(["[" * 100_000, '{"jobs": ' + "[" * 5000 + "]" * 5000 + "}", "\ud800"]),
    texts))
@example("[" * 100_000)  # RecursionError, where a ValueError belongs
def test_squeue_json(text: str) -> None:
    """squeue --json: a mapping of jobs, or a ValueError (the status query then asks
    sacct); through the query itself, never anything but the project's errors."""
    with contextlib.suppress(ValueError):
        jobs = queue.parse_squeue_json(text)
        assert all(isinstance(k, str) and isinstance(v["state"], str) for k, v in jobs.items())

    class Proc:
        returncode = 0
        stdout = text
        stderr = ""

    with mock.patch.object(_proc, "run", lambda argv, **kw: Proc()):
        clean(queue.job_states, ["10", "11"])


# -- end to end: the CLI ---------------------------------------------------------------------
_ERROR_LINE = re.compile(r"^train: error: (\S[^\n]*?): ", re.M)


def cli(argv: list[str]) -> tuple[int, str]:
    """`train ARGV` in this process: (exit code, stdout + stderr). Signal handlers that
    `train run` installs are put back."""
    from train.cli import main

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
    saved = {sig: signal.getsignal(sig) for sig in signals}
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    return code, out.getvalue() + err.getvalue()


def expect_field_error(code: int, output: str, expected: ConfigError | None) -> None:
    """Exit 0, or exit 2 with `train: error: FIELD: ...` (the expected error's own text
    where one is known), and never a traceback."""
    assert code in (0, EXIT_USAGE), output
    assert "Traceback" not in output, output
    if code == EXIT_USAGE:
        assert _ERROR_LINE.search(output), output
        if expected is not None:
            assert f"train: error: {expected}\n" in output, output


def _dumped(data: dict[Any, Any]) -> str:
    return yaml.safe_dump(data, allow_unicode=True)


@fuzz(20)
@given(st.one_of(yaml_documents(RUN_FIELDS), field_values(RunConfig, {}).map(_dumped),
                 keyed(RUN_FIELDS).map(_dumped)))
def test_cli_run_with_a_fuzzed_config(text: str) -> None:
    with written(text) as path:
        # a valid config stops at the run directory, a file's child: before any training
        out = str(path / "out")
        expected: ConfigError | None = None
        try:
            build_config(load_yaml(path), {"out": out})
        except ConfigError as exc:
            expected = exc
        code, output = cli(["run", "--config", str(path), "--out", out])
        expect_field_error(code, output, expected)
        if expected is None:
            assert code == EXIT_USAGE and "train: error: out: " in output, output


@fuzz(20)
@given(st.one_of(yaml_documents(JOB_FIELDS), field_values(JobSpec, JOB_TEXT).map(_dumped),
                 keyed(JOB_FIELDS).map(_dumped)))
@example('account: "\\ud800"')  # was exit 1: UnicodeEncodeError printing the script
def test_cli_render_with_a_fuzzed_job_file(text: str) -> None:
    with written(text) as path:
        expected: ConfigError | None = None
        try:  # what `train render` builds first: defaults (none here) < file < flags
            build(JobSpec, merged({}, load_yaml(path)), {"cluster": "local"})
        except ConfigError as exc:
            expected = exc
        code, output = cli(["render", str(path), "--cluster", "local"])
        expect_field_error(code, output, expected)
        if code == 0:
            assert output.startswith(("#!", "# ---- seed")), output
