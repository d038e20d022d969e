"""The GPU utilisation watch: the sampler (with an injected NVML and clock: samples are
counted, never timed), its process (parent gone, SIGTERM, no NVML), the readers for
`train status` and `train doctor`, the job settings and profile defaults, the rendered
script, and `train launch` starting one sampler per node."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import run_cli, spawn_group
from tests.unit.test_cuda_check import OK as USABLE
from train.batch import contract
from train.client import gpuwatch_reader
from train.client.clusters.profiles import Registry
from train.client.clusters.schema import DEFAULT_GPU_WATCH, GpuWatch
from train.client.gpuwatch_reader import idle_findings, read_records, summary
from train.client.slurm.jobspec import JobSpec
from train.client.slurm.render import render, step_argv
from train.client.slurm.resolve import resolve
from train.common import cuda_check, gpuwatch_file
from train.common.errors import ConfigError
from train.common.gpuwatch_file import CSV_HEADER, WatchSettings, csv_path
from train.node import gpuwatch
from train.node import launch as launch_mod
from train.node.gpuwatch import select_gpus, watch
from train.node.launch import LaunchOptions, launch

MIB = 1024 * 1024
REG = Registry(environ={})


class NVMLError(Exception):
    pass


class FakeNvml:
    """NVML as pynvml shows it, with a scripted utilisation series per GPU (the last value
    repeats). `broken` GPUs raise on every read, like a MIG-enabled card."""

    NVMLError = NVMLError

    def __init__(self, series: dict[int, list[int]], *, total_mib: int = 81920,
                 init_error: bool = False, broken: tuple[int, ...] = ()) -> None:
        self.series = series
        self.total = total_mib * MIB
        self.init_error = init_error
        self.broken = broken
        self.reads = dict.fromkeys(series, 0)
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error:
            raise NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.series)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i not in self.series:
            raise NVMLError("Invalid Argument")
        return i

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"GPU-{handle:04d}"

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        if handle in self.broken:
            raise NVMLError("Not Supported")
        values = self.series[handle]
        k = self.reads[handle]
        self.reads[handle] = k + 1
        return SimpleNamespace(gpu=values[min(k, len(values) - 1)], memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=(1000 + handle) * MIB, total=self.total, free=0)


class Clock:
    """Wall time that moves only when the sampler sleeps: N samples take no real time."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _watch(nvml: FakeNvml, run_dir: Path, samples: int, *, interval: float = 30,
           threshold: float = 50, minutes: float = 1, clock: Clock | None = None,
           sleep: Callable[[float], None] | None = None, node: str = "gpu-a01",
           visible: str | None = None) -> int:
    clock = clock or Clock()
    return watch(nvml, run_dir, node, WatchSettings(interval, threshold, minutes),
                 clock=clock.time, sleep=sleep or clock.sleep, max_samples=samples,
                 visible=visible)


def _rows(path: Path) -> list[list[str]]:
    return [line.split(",") for line in path.read_text().splitlines()[1:]
            if not line.startswith(gpuwatch_file.START_MARK)]


@pytest.fixture
def no_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests of the idle arithmetic itself: no warm-up (its own tests below)."""
    monkeypatch.setattr(gpuwatch_file, "WARMUP_MINUTES", 0.0)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name == "train.gpuwatch"]


# -- sampling ----------------------------------------------------------------------------

def test_one_line_per_gpu_per_sample_with_a_header_once(tmp_path: Path) -> None:
    nvml = FakeNvml({0: [10, 20, 30], 1: [90, 80, 70]})
    assert _watch(nvml, tmp_path, 3) == 0
    path = tmp_path / contract.GPU_WATCH_DIR / "gpu-a01.csv"
    assert path == csv_path(tmp_path, "gpu-a01")
    lines = path.read_text().splitlines()
    assert lines[0] == CSV_HEADER == "time,gpu,util_pct,mem_used_mib,mem_total_mib"
    rows = _rows(path)
    assert [(r[1], r[2], r[3], r[4]) for r in rows] == [
        ("0", "10", "1000", "81920"), ("1", "90", "1001", "81920"),
        ("0", "20", "1000", "81920"), ("1", "80", "1001", "81920"),
        ("0", "30", "1000", "81920"), ("1", "70", "1001", "81920")]
    times = [float(r[0]) for r in rows]
    assert times[0] == times[1] and times[2] - times[0] == 30  # one time per sample
    assert nvml.calls == ["init"]  # never nvmlShutdown: it can hang, the process ends
    # the next chunk of the chain appends to the same file, without a second header; each
    # sampler marks where its run begins
    assert _watch(FakeNvml({0: [5], 1: [5]}), tmp_path, 2) == 0
    text = path.read_text()
    assert text.count("time,") == 1 and len(text.splitlines()) == 1 + 1 + 6 + 1 + 4
    assert text.splitlines()[1] == f"{gpuwatch_file.START_MARK}{Clock().time():.1f}"


def test_every_sample_is_on_disk_before_the_sampler_waits(tmp_path: Path) -> None:
    clock = Clock()
    path = csv_path(tmp_path, "n1")
    seen: list[int] = []

    def sleep(seconds: float) -> None:
        seen.append(len(path.read_text().splitlines()))
        clock.sleep(seconds)

    _watch(FakeNvml({0: [50], 1: [50]}), tmp_path, 3, interval=1, clock=clock, sleep=sleep,
           node="n1")
    assert seen == [4, 6]  # header, mark + 2, + 4: flushed after each sample


def test_node_names_become_safe_file_names(tmp_path: Path) -> None:
    assert csv_path(tmp_path, "../../etc/x").parent == tmp_path / "gpu"
    assert csv_path(tmp_path, "gpu-a01.cluster").name == "gpu-a01.cluster.csv"


def test_the_idle_warning_fires_once_after_the_idle_time(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, no_warmup: None) -> None:
    caplog.set_level(logging.INFO, logger="train.gpuwatch")
    nvml = FakeNvml({0: [0] * 20, 1: [95] * 20})
    clock = Clock()
    counts: list[int] = []  # warnings so far, read as each sample starts

    def now() -> float:
        counts.append(len(_warnings(caplog)))
        return clock.time()

    # 30 s apart, 1 min: the third idle sample (0, 30, 60 s) completes the idle time
    watch(nvml, tmp_path, "gpu-a01", WatchSettings(30, 50, 1), clock=now,
          sleep=clock.sleep, max_samples=10)
    # (the first reading of the clock is the sampler's start mark)
    assert counts == [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1] and len(_warnings(caplog)) == 1
    message = _warnings(caplog)[0]
    assert "gpu-a01" in message and "GPU 0 " in message and "GPU 1" not in message
    assert "50%" in message and "1 min" in message
    assert "--workers" in message and "uses the GPU" in message


def test_the_warning_rearms_only_after_the_gpu_recovered(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, no_warmup: None) -> None:
    # idle 3 samples (warn), busy once, idle 3 samples again (warn again), idle on (no more)
    _watch(FakeNvml({0: [0, 0, 0, 0, 80, 1, 2, 3, 4, 5, 6]}), tmp_path, 11, minutes=1)
    assert len(_warnings(caplog)) == 2
    caplog.clear()
    # never three idle samples in a row: never idle for the whole minute
    _watch(FakeNvml({0: [0, 0, 90, 0, 0, 90, 0, 0]}), tmp_path, 8, minutes=1)
    assert _warnings(caplog) == []
    caplog.clear()
    # at the threshold is not under it
    _watch(FakeNvml({0: [50]}), tmp_path, 6, threshold=50, minutes=1)
    assert _warnings(caplog) == []


def test_gpus_idle_together_share_one_warning(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture,
                                             no_warmup: None) -> None:
    _watch(FakeNvml({0: [1], 1: [90], 2: [3]}), tmp_path, 5, minutes=1)
    assert len(_warnings(caplog)) == 1 and "GPUs 0, 2 " in _warnings(caplog)[0]


def test_no_driver_or_no_gpu_is_a_quiet_exit_0(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="train.gpuwatch")
    assert _watch(FakeNvml({0: [1]}, init_error=True), tmp_path, 3) == 0
    assert _watch(FakeNvml({}), tmp_path, 3) == 0
    assert not (tmp_path / "gpu").exists()
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.INFO]
    assert "Driver Not Loaded" in caplog.records[0].getMessage()


def _messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_a_gpu_that_never_reads_is_given_up_after_max_failures(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="train.gpuwatch")
    samples = gpuwatch.MAX_FAILURES + 5
    assert _watch(FakeNvml({0: [40], 1: [40]}, broken=(1,)), tmp_path, samples) == 0
    rows = _rows(csv_path(tmp_path, "gpu-a01"))
    assert [r[1] for r in rows] == ["0"] * samples  # GPU 0 sampled throughout
    assert len(_messages(caplog, "GPU 1 cannot be read")) == 1
    gave_up = _messages(caplog, "no longer sampled")
    assert len(gave_up) == 1 and f"GPU 1 gave no reading in {gpuwatch.MAX_FAILURES}" \
        in gave_up[0]
    # none readable: tried MAX_FAILURES times, then nothing to watch, exit 0
    caplog.clear()
    mig = FakeNvml({0: [40]}, broken=(0,))
    calls: list[int] = []
    real = mig.nvmlDeviceGetUtilizationRates
    mig.nvmlDeviceGetUtilizationRates = lambda h: calls.append(h) or real(h)  # type: ignore
    assert _watch(mig, tmp_path, 100, node="mig") == 0
    assert len(calls) == gpuwatch.MAX_FAILURES
    assert len(_messages(caplog, "GPU watch stopped: no GPU can be read")) == 1
    assert _rows(csv_path(tmp_path, "mig")) == []


class FlakyNvml(FakeNvml):
    """Reads (handles, or utilisation) of some GPUs fail at the listed attempts only."""

    def __init__(self, series: dict[int, list[int]], *, handle_fails: dict[int, set[int]]
                 | None = None, read_fails: dict[int, set[int]] | None = None) -> None:
        super().__init__(series)
        self.handle_fails = handle_fails or {}
        self.read_fails = read_fails or {}
        self.handle_tries = dict.fromkeys(series, 0)
        self.read_tries = dict.fromkeys(series, 0)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self.handle_tries[i] += 1
        if self.handle_tries[i] in self.handle_fails.get(i, set()):
            raise NVMLError("GPU is lost")
        return super().nvmlDeviceGetHandleByIndex(i)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        self.read_tries[handle] += 1
        if self.read_tries[handle] in self.read_fails.get(handle, set()):
            raise NVMLError("Unknown Error")
        return super().nvmlDeviceGetUtilizationRates(handle)


def _gpus_per_sample(path: Path) -> list[list[str]]:
    by_time: dict[str, list[str]] = {}
    for r in _rows(path):
        by_time.setdefault(r[0], []).append(r[1])
    return list(by_time.values())


def test_a_transient_read_error_drops_a_gpu_for_that_sample_only(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="train.gpuwatch")
    nvml = FlakyNvml({0: [40], 1: [60]}, read_fails={1: {2, 3}})
    assert _watch(nvml, tmp_path, 5) == 0
    assert _gpus_per_sample(csv_path(tmp_path, "gpu-a01")) == [
        ["0", "1"], ["0"], ["0"], ["0", "1"], ["0", "1"]]
    assert len(_messages(caplog, "GPU 1 cannot be read")) == 1
    assert _messages(caplog, "no longer sampled") == []


def test_a_handle_error_of_one_gpu_keeps_the_watch_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="train.gpuwatch")
    nvml = FlakyNvml({0: [40], 1: [60]}, handle_fails={1: {1, 2}})
    assert _watch(nvml, tmp_path, 4) == 0
    assert _gpus_per_sample(csv_path(tmp_path, "gpu-a01")) == [
        ["0"], ["0"], ["0", "1"], ["0", "1"]]
    assert _messages(caplog, "lists no GPU") == []
    assert len(_messages(caplog, "GPU 1 cannot be read")) == 1


class OddNvml(FakeNvml):
    """Utilisation and memory readings scripted per sample, whatever their type."""

    def __init__(self, utils: list[Any], mems: list[tuple[Any, Any]]) -> None:
        super().__init__({0: [0]})
        self.utils, self.mems = utils, mems
        self.k = 0

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self.utils[min(self.k, len(self.utils) - 1)], memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        used, total = self.mems[min(self.k, len(self.mems) - 1)]
        self.k += 1
        return SimpleNamespace(used=used, total=total, free=0)


GOOD_MEM = (1024 * MIB, 16384 * MIB)


def test_impossible_readings_are_left_out_and_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="train.gpuwatch")
    utils: list[Any] = [42, -5, 1e300, 10**400, float("nan"), float("inf"), "42%", None,
                        101, True, 7, 42, 42, 42, 42, 42]
    mems = [GOOD_MEM] * 11 + [(-2**40, -1), (10**30, 10**30), (2 * MIB, MIB),
                              (float("nan"), 1), GOOD_MEM]
    nvml = OddNvml(utils, mems)
    assert len(utils) == len(mems) == 16
    assert _watch(nvml, tmp_path, len(utils), threshold=10, minutes=0.5) == 0
    rows = _rows(csv_path(tmp_path, "gpu-a01"))
    assert [(r[2], r[3], r[4]) for r in rows] == [
        ("42", "1024", "16384"), ("7", "1024", "16384"), ("42", "1024", "16384")]
    assert len(_messages(caplog, "cannot be true")) == 1
    assert _warnings(caplog) == []  # -5 % was no idle sample
    # a GPU that says -5 % all along: no idle warning, no line
    caplog.clear()
    assert _watch(OddNvml([-5], [GOOD_MEM]), tmp_path, 10, node="neg", minutes=1) == 0
    assert _warnings(caplog) == [] and _rows(csv_path(tmp_path, "neg")) == []


@pytest.mark.parametrize(("util", "used", "total", "expected"), [
    (42, 2**30, 2**34, (42, 1024, 16384)),
    (0, 0, 0, (0, 0, 0)),
    (100.0, 2**34, 2**34, (100, 16384, 16384)),
    (-5, 0, 2**34, None), (101, 0, 2**34, None), (1e300, 0, 2**34, None),
    (10**400, 0, 2**34, None), (float("nan"), 0, 2**34, None), ("42", 0, 2**34, None),
    (None, 0, 2**34, None), (False, 0, 2**34, None),
    (42, -1, 2**34, None), (42, 0, -1, None), (42, 2**35, 2**34, None),
    (42, 2**31 * MIB, 2**31 * MIB, None), (42, 10**24 * MIB, 10**24 * MIB, None),
    (42, float("inf"), float("inf"), None), (42, "1", "2", None),
])
def test_valid_reading(util: Any, used: Any, total: Any, expected: Any) -> None:
    assert gpuwatch.valid_reading(util, used, total) == expected


class CountNvml(FakeNvml):
    def __init__(self, count: Any) -> None:
        super().__init__({0: [50]})
        self.count = count

    def nvmlDeviceGetCount(self) -> Any:
        if isinstance(self.count, Exception):
            raise self.count
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        assert i < gpuwatch.MAX_GPUS, "a GPU past the cap was asked for"
        return i

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=50, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(used=MIB, total=2 * MIB, free=0)


def test_an_absurd_gpu_count_is_capped(tmp_path: Path,
                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="train.gpuwatch")
    assert _watch(CountNvml(10**7), tmp_path, 2) == 0
    rows = _rows(csv_path(tmp_path, "gpu-a01"))
    assert len(rows) == 2 * gpuwatch.MAX_GPUS
    assert {int(r[1]) for r in rows} == set(range(gpuwatch.MAX_GPUS))
    assert len(_messages(caplog, f"more than {gpuwatch.MAX_GPUS} GPUs")) == 1


@pytest.mark.parametrize("count", [NVMLError("Unknown"), None, "2", -3, 0, 2.5])
def test_a_gpu_count_that_is_no_count_is_a_quiet_exit_0(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, count: Any) -> None:
    caplog.set_level(logging.INFO, logger="train.gpuwatch")
    assert _watch(CountNvml(count), tmp_path, 2) == 0
    assert not (tmp_path / "gpu").exists()
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "GPU watch off" in caplog.records[0].getMessage()


def test_the_header_is_on_disk_before_the_first_sample(tmp_path: Path) -> None:
    path = csv_path(tmp_path, "n1")
    seen: list[str] = []

    class Looking(FakeNvml):
        def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
            seen.append(path.read_text())
            return super().nvmlDeviceGetUtilizationRates(handle)

    _watch(Looking({0: [50]}), tmp_path, 1, node="n1")
    assert seen == [f"{CSV_HEADER}\n{gpuwatch_file.START_MARK}{Clock().time():.1f}\n"]


def test_messages_from_the_driver_are_printable(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="train.gpuwatch")
    assert _watch(CountNvml(NVMLError("fake \x1b[31mred\x1b[0m")), tmp_path, 1) == 0
    assert "\x1b" not in caplog.records[0].getMessage()


def test_only_the_jobs_gpus_are_sampled() -> None:
    nvml = FakeNvml({i: [0] for i in range(8)})
    assert select_gpus(nvml, 8, None) == list(range(8))
    assert select_gpus(nvml, 8, "2,5") == [2, 5]  # no device cgroup: NVML sees all 8
    assert select_gpus(nvml, 2, "0,1") == [0, 1]  # cgroup: NVML sees the job's two
    assert select_gpus(nvml, 8, "GPU-0003,GPU-0006") == [3, 6]
    assert select_gpus(nvml, 8, "GPU-unknown") == list(range(8))


def test_the_settings_come_from_the_job_environment() -> None:
    env = {contract.GPU_WATCH_INTERVAL_VAR: "30", contract.GPU_IDLE_THRESHOLD_VAR: "60",
           contract.GPU_IDLE_MINUTES_VAR: "15"}
    assert gpuwatch_file.settings_from_env(env) == WatchSettings(30, 60, 15)
    assert gpuwatch_file.settings_from_env({}) is None
    assert gpuwatch_file.settings_from_env({**env, contract.GPU_WATCH_INTERVAL_VAR: "0"}) is None
    with pytest.raises(ValueError, match=contract.GPU_IDLE_MINUTES_VAR):
        gpuwatch_file.settings_from_env({**env, contract.GPU_IDLE_MINUTES_VAR: "soon"})
    assert WatchSettings(30, 60, 15).as_env() == env


def _main_in_process(tmp_path: Path) -> int:
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM,
                                                  signal.SIGINT)}
    try:
        return gpuwatch.main(["--out", str(tmp_path), "--node", "n", "--interval", "1",
                              "--idle-threshold", "10", "--idle-minutes", "1"])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def test_missing_nvml_library_exits_0_with_one_info_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml: ImportError
    caplog.set_level(logging.INFO, logger="train.gpuwatch")
    assert _main_in_process(tmp_path) == 0
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "nvidia-ml-py" in caplog.records[0].getMessage()
    assert not (tmp_path / "gpu").exists()


def test_an_nvml_library_that_raises_as_it_loads_exits_0_with_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "broken-nvml"
    folder.mkdir()
    (folder / "pynvml.py").write_text("raise RuntimeError('libnvidia-ml.so.1: broken')\n")
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.syspath_prepend(str(folder))
    caplog.set_level(logging.INFO, logger="train.gpuwatch")
    assert _main_in_process(tmp_path) == 0
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "libnvidia-ml.so.1: broken" in caplog.records[0].getMessage()
    assert not (tmp_path / "gpu").exists()


# -- the process -------------------------------------------------------------------------

FAKE_PYNVML = textwrap.dedent("""\
    # a stand-in for nvidia-ml-py in the sampler's subprocess: two GPUs, 42 % busy
    from types import SimpleNamespace
    class NVMLError(Exception):
        pass
    def nvmlInit(): pass
    def nvmlShutdown(): pass
    def nvmlDeviceGetCount(): return 2
    def nvmlDeviceGetHandleByIndex(i): return i
    def nvmlDeviceGetUtilizationRates(h): return SimpleNamespace(gpu=42, memory=0)
    def nvmlDeviceGetMemoryInfo(h):
        return SimpleNamespace(used=2**30, total=2**34, free=0)
    """)


@pytest.fixture
def fake_nvml_env(tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "fake-nvml"
    folder.mkdir()
    (folder / "pynvml.py").write_text(FAKE_PYNVML)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _sampler(run_dir: Path, parent: int, env: dict[str, str],
             interval: str = "0.05") -> subprocess.Popen[str]:
    return spawn_group([sys.executable, "-m", "train.node.gpuwatch", "--out",
                        str(run_dir), "--node", "n1", "--interval", interval,
                        "--idle-threshold", "10", "--idle-minutes", "5",
                        "--parent", str(parent)], env=env)


def _sample_count(path: Path) -> int:
    try:
        return max(0, len(path.read_text().splitlines()) - 1) // 2
    except OSError:
        return 0


def _until(condition: Callable[[], bool], proc: subprocess.Popen[str]) -> None:
    """Poll for a count of samples; the deadline only guards against a hang."""
    deadline = time.monotonic() + 60
    while not condition():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "hang guard: the sampler made no progress"
        time.sleep(0.02)


def test_the_sampler_exits_once_its_parent_is_gone(tmp_path: Path,
                                                   fake_nvml_env: dict[str, str]) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    proc = _sampler(tmp_path, gone.pid, fake_nvml_env)
    _, err = proc.communicate(timeout=60)  # hang guard only
    assert proc.returncode == 0, err
    assert _sample_count(csv_path(tmp_path, "n1")) == 0  # gone before it began: no sample


def test_the_sampler_samples_while_the_parent_lives_then_exits(
        tmp_path: Path, fake_nvml_env: dict[str, str]) -> None:
    parent = spawn_group([sys.executable, "-c", "import time; time.sleep(600)"])
    proc = _sampler(tmp_path, parent.pid, fake_nvml_env)
    path = csv_path(tmp_path, "n1")
    _until(lambda: _sample_count(path) >= 3, proc)
    parent.kill()
    parent.wait()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    rows = _rows(path)
    assert {r[1] for r in rows} == {"0", "1"} and {r[2] for r in rows} == {"42"}
    assert {(r[3], r[4]) for r in rows} == {("1024", "16384")}


def test_the_sampler_ignores_the_walltime_usr1_and_ends_on_term(
        tmp_path: Path, fake_nvml_env: dict[str, str]) -> None:
    proc = _sampler(tmp_path, os.getpid(), fake_nvml_env)
    path = csv_path(tmp_path, "n1")
    _until(lambda: _sample_count(path) >= 1, proc)
    proc.send_signal(signal.SIGUSR1)
    before = _sample_count(path)
    _until(lambda: _sample_count(path) >= before + 2, proc)  # still sampling
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err  # TERM keeps its default action
    assert "GPU watch: 2 GPU(s)" in err and "WARNING" not in err


def test_the_sampler_without_nvml_exits_0_in_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "no-nvml"
    folder.mkdir()
    (folder / "pynvml.py").write_text("raise ImportError('no nvidia-ml-py here')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)}
    proc = _sampler(tmp_path, os.getpid(), env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert len(err.strip().splitlines()) == 1 and "GPU watch off" in err


BLOCKING_PYNVML = textwrap.dedent("""\
    # two GPUs; FAKE_NVML_MODE picks the call that never returns (after creating the file
    # FAKE_NVML_MARK): util_block, shutdown_block
    import os, time
    from types import SimpleNamespace
    MODE = os.environ.get("FAKE_NVML_MODE", "")
    class NVMLError(Exception):
        pass
    def _block():
        open(os.environ["FAKE_NVML_MARK"], "w").close()
        time.sleep(3600)
    def nvmlInit(): pass
    def nvmlShutdown():
        if MODE == "shutdown_block": _block()
    def nvmlDeviceGetCount(): return 2
    def nvmlDeviceGetHandleByIndex(i): return i
    def nvmlDeviceGetUtilizationRates(h):
        if MODE == "util_block": _block()
        return SimpleNamespace(gpu=42, memory=0)
    def nvmlDeviceGetMemoryInfo(h):
        return SimpleNamespace(used=2**30, total=2**34, free=0)
    """)


@pytest.fixture
def blocking_nvml_env(tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "blocking-nvml"
    folder.mkdir()
    (folder / "pynvml.py").write_text(BLOCKING_PYNVML)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "FAKE_NVML_MARK": str(tmp_path / "blocked")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _until_exists(path: Path, proc: subprocess.Popen[str]) -> None:
    _until(path.exists, proc)


def test_term_ends_the_sampler_inside_a_blocking_nvml_call(
        tmp_path: Path, blocking_nvml_env: dict[str, str]) -> None:
    env = {**blocking_nvml_env, "FAKE_NVML_MODE": "util_block"}
    proc = _sampler(tmp_path, os.getpid(), env)
    _until_exists(tmp_path / "blocked", proc)  # inside nvmlDeviceGetUtilizationRates
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)  # hang guard only
    assert proc.returncode == -signal.SIGTERM, err
    assert "Traceback" not in err


def test_the_sampler_ends_with_its_parent_inside_a_blocking_nvml_call(
        tmp_path: Path, blocking_nvml_env: dict[str, str]) -> None:
    env = {**blocking_nvml_env, "FAKE_NVML_MODE": "util_block"}
    argv = [sys.executable, "-m", "train.node.gpuwatch", "--out", str(tmp_path),
            "--node", "n1", "--interval", "0.05", "--idle-threshold", "10",
            "--idle-minutes", "5"]
    # the parent starts the sampler (default --parent: its parent) and waits
    parent = spawn_group([sys.executable, "-c", textwrap.dedent(f"""\
        import subprocess, sys, time
        proc = subprocess.Popen({argv!r}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        print(proc.pid, flush=True)
        time.sleep(600)
        """)], env=env)
    assert parent.stdout is not None
    sampler = int(parent.stdout.readline())
    _until_exists(tmp_path / "blocked", parent)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 60
    while gpuwatch.process_alive(sampler):
        assert time.monotonic() < deadline, "hang guard: the sampler outlived its parent"
        time.sleep(0.02)


def test_a_parent_named_by_pid_ends_the_sampler_inside_a_blocking_nvml_call(
        tmp_path: Path, blocking_nvml_env: dict[str, str]) -> None:
    # --parent is not this process's parent (no PR_SET_PDEATHSIG): the polling thread
    parent = spawn_group([sys.executable, "-c", "import time; time.sleep(600)"])
    env = {**blocking_nvml_env, "FAKE_NVML_MODE": "util_block"}
    proc = _sampler(tmp_path, parent.pid, env)
    _until_exists(tmp_path / "blocked", proc)
    parent.kill()
    parent.wait()
    _, err = proc.communicate(timeout=60)  # hang guard only
    assert proc.returncode == 0, err


def test_the_sampler_never_waits_for_nvml_shutdown(
        tmp_path: Path, blocking_nvml_env: dict[str, str]) -> None:
    parent = spawn_group([sys.executable, "-c", "import time; time.sleep(600)"])
    env = {**blocking_nvml_env, "FAKE_NVML_MODE": "shutdown_block"}
    proc = _sampler(tmp_path, parent.pid, env)
    _until(lambda: _sample_count(csv_path(tmp_path, "n1")) >= 1, proc)
    parent.kill()
    parent.wait()
    _, err = proc.communicate(timeout=60)  # hang guard only
    assert proc.returncode == 0, err
    assert not (tmp_path / "blocked").exists()


def test_a_fifo_in_place_of_the_file_is_one_line_and_exit_0(
        tmp_path: Path, fake_nvml_env: dict[str, str]) -> None:
    path = csv_path(tmp_path, "n1")
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    proc = _sampler(tmp_path, os.getpid(), fake_nvml_env)
    _, err = proc.communicate(timeout=60)  # hang guard: an open that waits for a reader
    assert proc.returncode == 0, err
    assert len(err.strip().splitlines()) == 1 and "not a regular file" in err


def test_a_device_in_place_of_the_file_is_one_line_and_exit_0(
        tmp_path: Path, fake_nvml_env: dict[str, str]) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    path = csv_path(tmp_path, "n1")
    path.parent.mkdir(parents=True)
    path.symlink_to("/dev/full")
    proc = _sampler(tmp_path, os.getpid(), fake_nvml_env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert len(err.strip().splitlines()) == 1 and "not a regular file" in err


def test_a_full_disk_stops_the_sampler_with_one_line(
        tmp_path: Path, fake_nvml_env: dict[str, str]) -> None:
    # a file size limit stands for the full disk: the header fits, the second sample not
    code = textwrap.dedent(f"""\
        import resource, runpy, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))
        sys.argv = ["gpuwatch", "--out", {str(tmp_path)!r}, "--node", "n1", "--interval",
                    "0.05", "--idle-threshold", "10", "--idle-minutes", "5",
                    "--parent", "{os.getpid()}"]
        runpy.run_module("train.node.gpuwatch", run_name="__main__")
        """)
    proc = spawn_group([sys.executable, "-c", code], env=fake_nvml_env)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 2, err
    assert "GPU watch stopped: cannot write" in lines[1]
    assert csv_path(tmp_path, "n1").read_text().startswith(CSV_HEADER + "\n")


# -- reading -----------------------------------------------------------------------------

def _written(tmp_path: Path) -> Path:
    """Two nodes: a01 busy, a02 with GPU 1 idle since its 5th sample (30 s apart)."""
    _watch(FakeNvml({0: [80, 90], 1: [60, 70]}), tmp_path, 10, node="a01")
    _watch(FakeNvml({0: [95], 1: [90, 90, 90, 90, 2, 3, 1, 0, 4, 5, 2, 1]}), tmp_path, 12,
           node="a02")
    return tmp_path


def test_summary_per_node(tmp_path: Path) -> None:
    run = _written(tmp_path)
    nodes = summary(run, threshold=10, minutes=3)
    assert set(nodes) == {"a01", "a02"}
    a01, a02 = nodes["a01"], nodes["a02"]
    assert a01["gpus"] == 2 and a01["samples"] == 10 and not a01["partial"]
    assert a01["mean_util"] == pytest.approx((80 + 60 + 9 * (90 + 70)) / 20, abs=0.05)
    assert a01["latest_util"] == 80.0 and a01["latest"] == {0: 90.0, 1: 70.0}
    assert a01["latest_time"] == a01["first_time"] + 9 * 30
    assert a01["idle"] is False and a01["idle_description"] == ""
    # a02's GPU 1: under 10% for the last 8 samples, 3.5 min: idle now
    assert a02["idle"] is True and a02["latest_util"] == pytest.approx((95 + 1) / 2)
    assert a02["idle_description"].startswith("GPU 1 under 10% for 4 min")
    assert summary(run, threshold=10, minutes=4)["a02"]["idle"] is False
    assert summary(tmp_path / "nowhere") == {}


def test_idle_findings_name_the_gpu_and_the_lines(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    run = _written(tmp_path)
    found = idle_findings(run, threshold=10, minutes=3)
    assert len(found) == 1
    f = found[0]
    assert (f.node, f.gpu, f.samples, f.ongoing) == ("a02", 1, 8, True)
    assert f.minutes == pytest.approx(3.5) and f.max_util == 5
    # header on line 1, the sampler's mark on 2, two lines per sample: GPU 1 of sample 5
    # is line 12, of 12 line 26
    assert (f.first_line, f.last_line) == (12, 26)
    lines = Path(f.file).read_text().splitlines()
    assert lines[f.first_line - 1].split(",")[1:3] == ["1", "2"]
    text = f.describe()
    assert "node a02 GPU 1" in text and "lines 12-26" in text and f.file in text
    assert idle_findings(run, threshold=10, minutes=4) == []
    # a higher threshold: no sample of any GPU reaches it, and all of them are in the
    # sampler's first 10 minutes: start-up, not idleness
    assert idle_findings(run, threshold=100, minutes=1) == []
    # without the warm-up every GPU of both nodes would be idle
    monkeypatch.setattr(gpuwatch_file, "WARMUP_MINUTES", 0.0)
    assert {(x.node, x.gpu) for x in idle_findings(run, threshold=100, minutes=1)} == {
        ("a01", 0), ("a01", 1), ("a02", 0), ("a02", 1)}


def test_the_reader_loads_nothing_of_the_node_side() -> None:
    """`train status` and `train doctor` read the files through gpuwatch_reader: it loads
    neither the sampler, the sampler's process, NVML nor torch (a fresh interpreter)."""
    code = "import sys, train.client.gpuwatch_reader; print(' '.join(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    loaded = set(proc.stdout.split())
    assert "train.client.gpuwatch_reader" in loaded
    assert not loaded & {"train.node.gpuwatch",
                         "pynvml", "torch", "numpy"}


def test_readers_skip_garbage_lines(tmp_path: Path) -> None:
    path = csv_path(tmp_path, "g1")
    path.parent.mkdir(parents=True)
    path.write_bytes(
        b"time,gpu,util_pct,mem_used_mib,mem_total_mib\n"
        b"1700000000.0,0,5,10,100\n"
        b"garbage\n"
        b"\xff\xfe not utf-8\n"
        b"1700000030.0,0,nan,10,100\n"
        b"1700000030.0,0,150,10,100\n"
        b"1700000030.0,-1,5,10,100\n"
        b"1700000030.0,0,5,10\n"
        b"time,gpu,util_pct,mem_used_mib,mem_total_mib\n"
        b"1700000060.0,0,7,10,100\n"
        b"1700000090.0,0,9,10,100\n"
        b"1700000120.0,0,8")  # a sample still being written
    assert [r.line for r in read_records(path)] == [2, 10, 11]
    node = summary(tmp_path, threshold=10, minutes=1)["g1"]
    assert node["samples"] == 3 and node["mean_util"] == 7.0 and node["idle"] is True
    found = idle_findings(tmp_path, threshold=10, minutes=1)
    assert [(f.first_line, f.last_line, f.samples) for f in found] == [(2, 11, 3)]
    (tmp_path / "gpu" / "empty.csv").write_text("")
    (tmp_path / "gpu" / "junk.csv").write_text("not,a,gpu,file\n" * 10)
    assert set(summary(tmp_path)) == {"g1"}


@pytest.mark.parametrize(("line", "ok"), [
    ("1700000000.0,0,5,10,100", True),
    ("1700000000.0,1023,5,10,100", True),
    ("1700000000.0,1024,5,10,100", False),
    ("1700000000.0,99999999999999999999999,5,10,100", False),
    ("1e300,0,5,10,100", False),
    ("100000000000,0,5,10,100", False),
    ("99999999999,0,5,10,100", True),
    ("0,0,5,10,100", False),
    ("inf,0,5,10,100", False),
    ("1700000000.0,0,5,-1,100", False),
    ("1700000000.0,0,5,10,2147483648", False),
    ("1700000000.0,0,5,10," + "9" * 5000, False),
    ("1700000000.0,0,-5,10,100", False),
])
def test_parse_line_accepts_only_sane_values(line: str, ok: bool) -> None:
    assert (gpuwatch_reader.parse_line(line, 1) is not None) is ok


def test_describe_never_raises_on_odd_times() -> None:
    for start in (1e300, -1e300, float("nan"), float("inf"), 1e11, 0.0):
        finding = gpuwatch_reader.IdleFinding("n", 0, "f.csv", 2, 3, start, start, 2, 1.0, 10.0,
                                       True)
        assert "node n GPU 0" in finding.describe()


def test_idle_findings_read_only_the_tail_with_true_line_numbers(tmp_path: Path) -> None:
    import inspect

    assert inspect.signature(idle_findings).parameters["max_bytes"].default == \
        gpuwatch_reader.SUMMARY_MAX_BYTES
    path = csv_path(tmp_path, "big")
    path.parent.mkdir(parents=True)
    with path.open("w") as f:
        f.write(CSV_HEADER + "\n")
        for k in range(3000):  # idle at the start (k < 100) and at the end (k >= 2900)
            f.write(f"{1_700_000_000 + 30 * k}.0,0,{0 if k < 100 or k >= 2900 else 90},1,2\n")
    tail = idle_findings(tmp_path, threshold=10, minutes=30, max_bytes=5000)
    assert [(x.first_line, x.last_line, x.ongoing) for x in tail] == [(2902, 3001, True)]
    whole = idle_findings(tmp_path, threshold=10, minutes=30, max_bytes=None)
    assert [(x.first_line, x.last_line) for x in whole] == [(2, 101), (2902, 3001)]
    lines = path.read_text().splitlines()
    assert lines[2902 - 1].startswith(f"{1_700_000_000 + 30 * 2900}.0,0,0,")


def test_the_readers_never_raise_on_any_content(tmp_path: Path) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    field = st.one_of(
        st.integers(min_value=-(10**30), max_value=10**30).map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.sampled_from(["1e300", "99999999999999999999999", "nan", "-0", "", "1_0",
                         "1700000000.0", "0", "100", "1023", "1024", "9" * 5000]),
        st.text(max_size=8))
    line = st.one_of(st.lists(field, min_size=5, max_size=5).map(",".join),
                     st.lists(field, max_size=7).map(",".join))
    content = st.one_of(
        st.lists(line, max_size=30).map(lambda ls: "\n".join(ls).encode("utf-8", "replace")),
        st.binary(max_size=300))
    path = csv_path(tmp_path, "fuzz")
    path.parent.mkdir(parents=True, exist_ok=True)

    @settings(max_examples=150, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(data=content, max_bytes=st.sampled_from([None, 7, 64, gpuwatch_reader.SUMMARY_MAX_BYTES]))
    def check(data: bytes, max_bytes: int | None) -> None:
        path.write_bytes(data)
        for rec in read_records(path, max_bytes):
            assert 0 < rec.time < gpuwatch_file.MAX_TIME and 0 <= rec.gpu <= 1023
            assert 0 <= rec.util <= 100
        for node in summary(tmp_path, threshold=10, minutes=0,
                            max_bytes=max_bytes or gpuwatch_reader.SUMMARY_MAX_BYTES).values():
            str(node)
        for finding in idle_findings(tmp_path, threshold=50, minutes=0,
                                     max_bytes=max_bytes):
            finding.describe()

    check()


def test_summary_reads_only_the_tail_of_a_large_file(tmp_path: Path) -> None:
    path = csv_path(tmp_path, "big")
    path.parent.mkdir(parents=True)
    with path.open("w") as f:
        f.write(CSV_HEADER + "\n")
        for k in range(5000):  # busy first, idle at the end
            f.write(f"{1_700_000_000 + 30 * k}.0,0,{90 if k < 4000 else 0},1,2\n")
    node = summary(tmp_path, threshold=10, minutes=30, max_bytes=20_000)["big"]
    assert node["partial"] is True and node["samples"] < 1000
    assert node["mean_util"] == 0.0 and node["idle"] is True
    assert node["first_time"] > 1_700_000_000 + 30 * 4000
    # line numbers of a tail still count from the top of the file
    tail = list(read_records(path, max_bytes=200))
    assert tail[-1].line == 5001 and tail[0].line > 4990
    full = summary(tmp_path, threshold=10, minutes=30)["big"]
    assert full["partial"] is False and full["samples"] == 5000


def _chain_of_samplers(run_dir: Path, chunks: list[list[int]], *, gap: float = 3 * 3600,
                       interval: float = 30) -> Clock:
    """The samplers of a chain's chunks (the real loop, a fake NVML and clock), each
    appending to the node's one file, `gap` seconds of queue wait between them."""
    clock = Clock()
    for k, series in enumerate(chunks):
        if k:
            clock.now += gap
        watch(FakeNvml({0: series}), run_dir, "n1", WatchSettings(interval, 60, 15),
              clock=clock.time, sleep=clock.sleep, max_samples=len(series))
    return clock


# issue 18 item 7: a healthy chain, each chunk idle while it starts (imports, CUDA, the
# rendezvous) and while it saves its checkpoint at the end, with 3 hours of queue between
# chunks: Torch's settings (60%, 15 min)
HEALTHY_CHUNK = [0] * 6 + [90] * 100 + [0] * 4  # 3 min start-up, 50 busy, 2 min saving


def test_the_queue_wait_between_chunks_is_no_idle_time(tmp_path: Path) -> None:
    _chain_of_samplers(tmp_path, [HEALTHY_CHUNK] * 3)
    text = csv_path(tmp_path, "n1").read_text()
    assert text.count(gpuwatch_file.START_MARK) == 3
    assert idle_findings(tmp_path, threshold=60, minutes=15) == []
    # the status table's idle flag: chunk 3 is busy now, chunk 2's end is not its start
    node = summary(tmp_path, threshold=60, minutes=15)["n1"]
    assert node["idle"] is False and node["gpus"] == 1


def test_idle_status_now_counts_from_the_chunk_that_runs(tmp_path: Path) -> None:
    # chunk 1 ended idle (saving), chunk 2 is 4 minutes into its start-up: not idle
    _chain_of_samplers(tmp_path, [HEALTHY_CHUNK, [0] * 8])
    assert summary(tmp_path, threshold=60, minutes=15)["n1"]["idle"] is False
    assert idle_findings(tmp_path, threshold=60, minutes=15) == []


def test_a_program_that_never_uses_the_gpu_is_idle_after_the_warm_up(tmp_path: Path) -> None:
    # 40 minutes at 0% from the sampler's start: the first 10 are the warm-up, the 30
    # after them are an idle stretch (15 min is the idle time)
    _chain_of_samplers(tmp_path, [HEALTHY_CHUNK, [0] * 81])
    [f] = idle_findings(tmp_path, threshold=60, minutes=15)
    assert f.ongoing and f.minutes == pytest.approx(30.0)
    lines = Path(f.file).read_text().splitlines()
    mark = max(i for i, line in enumerate(lines) if line.startswith(gpuwatch_file.START_MARK))
    started = float(lines[mark][len(gpuwatch_file.START_MARK):])
    assert f.first_line == mark + 1 + 21  # the 21st sample of chunk 2 is 10 min in
    assert f.start - started == gpuwatch_file.WARMUP_MINUTES * 60
    assert summary(tmp_path, threshold=60, minutes=15)["n1"]["idle"] is True


def test_the_warm_up_ends_at_the_first_busy_sample(tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    # busy after 1 minute, then idle for 20 minutes: the stretch starts right after the
    # busy sample, not 10 minutes after the start; the live warning says the same
    _chain_of_samplers(tmp_path, [[0, 0, 95] + [0] * 40])
    [f] = idle_findings(tmp_path, threshold=60, minutes=15)
    assert f.samples == 40 and f.minutes == pytest.approx(19.5)
    assert len(_warnings(caplog)) == 1
    caplog.clear()
    # the same start-up without the busy sample: 21.5 min, 10 of them warm-up: no finding
    _chain_of_samplers(tmp_path / "b", [[0] * 43])
    assert idle_findings(tmp_path / "b", threshold=60, minutes=15) == []
    assert _warnings(caplog) == []


def test_a_file_without_marks_is_one_stretch_without_warm_up(tmp_path: Path) -> None:
    """Files of samplers that wrote no mark (and tails that start after the last mark):
    one run whose start is unknown."""
    path = csv_path(tmp_path, "old")
    path.parent.mkdir(parents=True)
    path.write_text(CSV_HEADER + "\n" + "".join(
        f"{1_700_000_000 + 30 * k}.0,0,0,1,2\n" for k in range(40)))
    [f] = idle_findings(tmp_path, threshold=60, minutes=15)
    assert (f.first_line, f.samples) == (2, 40)


# -- job settings, profiles, rendering ---------------------------------------------------

LOCAL = dict(cluster="local", cpus_per_task=1, mem="1000M", runtime="none", workload=("demo",))
TORCH = dict(cluster="torch", account="torch_pr_1_x", constraint="h200|l40s",
             runtime="none", workload=("demo",))


def _resolve(**kw: Any) -> Any:
    spec = JobSpec(**kw)
    return resolve(spec, REG.get(spec.cluster or "local"))


@pytest.mark.parametrize(("field", "value", "why"), [
    ("gpu_idle_threshold", 101, "percentage"), ("gpu_idle_threshold", -1, "at least 0"),
    ("gpu_watch_interval", -5, "at least 0"), ("gpu_watch_interval", 3601, "at most 3600"),
    ("gpu_idle_minutes", 0, "greater than 0"), ("gpu_idle_minutes", "soon", "integer"),
])
def test_bad_watch_settings_name_the_field(field: str, value: Any, why: str) -> None:
    with pytest.raises(ConfigError) as err:
        JobSpec(**{**LOCAL, field: value})
    assert err.value.field == field and why in str(err.value)


def test_a_bad_watch_setting_on_the_command_line_is_exit_2() -> None:
    proc = run_cli(["render", "--cluster", "local", "-g", "1", "--gpu-idle-threshold",
                    "150", "--", "demo"])
    assert proc.returncode == 2 and "gpu_idle_threshold" in proc.stderr, proc.stderr


def test_defaults_come_from_the_profile_and_the_job_overrides_them() -> None:
    assert REG.get("torch").gpu_watch == GpuWatch(interval=30, idle_threshold=60,
                                                  idle_minutes=15)
    assert REG.get("gilbreth").gpu_watch == DEFAULT_GPU_WATCH
    assert _resolve(**TORCH, gpus_per_node=1).gpu_watch == GpuWatch(30, 60, 15)
    assert _resolve(**TORCH, gpus_per_node=1, gpu_idle_threshold=75,
                    gpu_watch_interval=10).gpu_watch == GpuWatch(10, 75, 15)
    assert _resolve(**LOCAL, gpus_per_node=2).gpu_watch == GpuWatch(30, 10, 30)
    # no GPUs, or the watch turned off: nothing to watch
    assert _resolve(**LOCAL).gpu_watch is None
    assert _resolve(**LOCAL, gpus_per_node=1, gpu_watch_interval=0).gpu_watch is None


def test_profile_watch_settings_are_validated(tmp_path: Path) -> None:
    def load(text: str) -> Any:
        path = tmp_path / "site.yaml"
        path.write_text("name: site\nextends: local\n" + text)
        return Registry(extra_files=[path], environ={}).get("site")

    assert load("gpu_watch: {idle_minutes: 5}\n").gpu_watch == GpuWatch(30, 10, 5)
    assert load("gpu_watch: {interval: 0}\n").gpu_watch.interval == 0
    for text, where in [("gpu_watch: {idle_threshold: 150}\n", "gpu_watch.idle_threshold"),
                        ("gpu_watch: {idle_minutes: 0}\n", "gpu_watch.idle_minutes"),
                        ("gpu_watch: {interval: -1}\n", "gpu_watch.interval"),
                        ("gpu_watch: {interval: '30'}\n", "gpu_watch.interval"),
                        ("gpu_watch: {every: 30}\n", "gpu_watch.every"),
                        ("gpu_watch: 30\n", "gpu_watch")]:
        with pytest.raises(ConfigError) as err:
            load(text)
        assert err.value.field == f"profile site.{where}", text


def test_the_rendered_script_carries_the_settings_to_the_launcher() -> None:
    from train.common.entry import entry_code

    job = _resolve(**TORCH, gpus_per_node=1)
    text = render(job)
    export = next(line for line in text.splitlines() if line.startswith("export "))
    assert (f"{contract.GPU_WATCH_INTERVAL_VAR}=30 {contract.GPU_IDLE_THRESHOLD_VAR}=60 "
            f"{contract.GPU_IDLE_MINUTES_VAR}=15") in export
    # one GPU, `train run`: through `train launch`, which starts the sampler
    argv = step_argv(job)
    assert argv[argv.index("launch") - 2:len(argv) - argv[::-1].index("--") - 1] == [
        "-c", entry_code(), "launch", "--mode=single"]
    for off in (_resolve(**LOCAL), _resolve(**LOCAL, gpus_per_node=1, gpu_watch_interval=0)):
        text = render(off)
        assert "TRAIN_GPU_" not in text
        assert "launch" not in step_argv(off)  # `train run` alone, as before


# -- `train launch` ----------------------------------------------------------------------

class Execed(Exception):
    """Stands for os.execvpe: the launch reached the point of becoming the program."""


class FakeProc:
    def __init__(self) -> None:
        self.terminated = False

    def terminate(self) -> None:
        self.terminated = True

    def wait(self, timeout: float | None = None) -> int:
        return 0


@pytest.fixture
def launchable(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Any, ...]]]:
    """`launch` up to the point of starting: CUDA usable, no shim, exec and torch's launcher
    stubbed, and the sampler's spawn recorded (node, run dir, settings, parent, process)."""
    spawned: list[tuple[Any, ...]] = []

    def spawn(run_dir: str, node: str, settings: WatchSettings, parent: int,
              env: dict[str, str] | None = None) -> FakeProc:
        proc = FakeProc()
        spawned.append((node, run_dir, settings, parent, proc))
        return proc

    def execvpe(*args: Any) -> None:
        raise Execed

    monkeypatch.setattr(cuda_check, "gather_facts", lambda env=None: USABLE)
    monkeypatch.setattr(launch_mod, "install_scontrol_shim", lambda env: None)
    monkeypatch.setattr(launch_mod, "log_interconnect", lambda env: None)
    monkeypatch.setattr(gpuwatch, "spawn", spawn)
    monkeypatch.setattr(os, "execvpe", execvpe)
    import torch.distributed.run

    monkeypatch.setattr(torch.distributed.run, "main", lambda argv: None)
    handler = signal.getsignal(signal.SIGUSR1)  # torchrun mode sets its own
    try:
        yield spawned
    finally:
        signal.signal(signal.SIGUSR1, handler)


WATCH_ENV = {contract.GPU_WATCH_INTERVAL_VAR: "30", contract.GPU_IDLE_THRESHOLD_VAR: "60",
             contract.GPU_IDLE_MINUTES_VAR: "15", "TRAIN_RUN_DIR": "/runs/x",
             "TRAIN_MASTER_ADDR": "10.0.0.1"}


def _step_env(node: int, local: int, tasks_per_node: int, gpus: str = "0,1") -> dict[str, str]:
    return {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "gpu-a[01-02]", "SLURM_NNODES": "2",
            "SLURM_NODEID": str(node), "SLURM_LOCALID": str(local),
            "SLURM_PROCID": str(node * tasks_per_node + local),
            "SLURM_NTASKS": str(2 * tasks_per_node),
            "SLURM_NTASKS_PER_NODE": str(tasks_per_node), "SLURM_CPUS_PER_TASK": "2",
            "CUDA_VISIBLE_DEVICES": gpus, "PATH": os.environ.get("PATH", ""), **WATCH_ENV}


def test_tasks_mode_starts_one_sampler_per_node(launchable: list[tuple[Any, ...]]) -> None:
    command = [sys.executable, "-c", "pass"]
    for node in (0, 1):
        for local in (0, 1):
            with pytest.raises(Execed):  # it went on to exec the program
                launch(LaunchOptions(mode="tasks", command=command),
                       _step_env(node, local, 2))
    assert [s[0] for s in launchable] == ["gpu-a01", "gpu-a02"]
    _, run_dir, settings, parent, proc = launchable[0]
    assert run_dir == "/runs/x" and settings == WatchSettings(30, 60, 15)
    assert parent == os.getpid()  # the program it execs into keeps this pid
    assert not proc.terminated  # it outlives the exec, and ends when the program does


def test_a_single_process_starts_its_sampler_without_a_rendezvous(
        launchable: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    def unresolvable(node: str) -> str:
        raise AssertionError("one process needs no master address")

    monkeypatch.setattr(launch_mod, "resolve_address", unresolvable)
    env = {**_step_env(0, 0, 1), "SLURM_JOB_NODELIST": "gpu-a01", "SLURM_NNODES": "1",
           "SLURM_NTASKS": "1"}
    del env["TRAIN_MASTER_ADDR"]
    with pytest.raises(Execed):
        launch(LaunchOptions(mode="single", command=[sys.executable, "-c", "pass"]), env)
    assert [s[0] for s in launchable] == ["gpu-a01"]


def test_torchrun_mode_starts_one_sampler_per_node_and_stops_it(
        launchable: list[tuple[Any, ...]]) -> None:
    for node in (0, 1):
        assert launch(LaunchOptions(mode="torchrun", command=["python3", "-m", "train",
                                                              "run", "demo"]),
                      _step_env(node, 0, 1)) == 0
    assert [s[0] for s in launchable] == ["gpu-a01", "gpu-a02"]
    assert all(s[4].terminated for s in launchable)  # stopped once the workers are done


def test_no_sampler_without_gpus_or_settings(launchable: list[tuple[Any, ...]]) -> None:
    command = ["python3", "-m", "train", "run", "demo"]
    launch(LaunchOptions(mode="torchrun", command=command), _step_env(0, 0, 1, gpus=""))
    env = {k: v for k, v in _step_env(0, 0, 1).items()
           if k != contract.GPU_WATCH_INTERVAL_VAR}
    launch(LaunchOptions(mode="torchrun", command=command), env)
    assert launchable == []


def test_a_sampler_that_cannot_start_never_fails_the_launch(
        launchable: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("no such interpreter")

    monkeypatch.setattr(gpuwatch, "spawn", broken)
    command = ["python3", "-m", "train", "run", "demo"]
    assert launch(LaunchOptions(mode="torchrun", command=command), _step_env(0, 0, 1)) == 0
    env = {**_step_env(0, 0, 1), contract.GPU_IDLE_MINUTES_VAR: "later"}
    assert launch(LaunchOptions(mode="torchrun", command=command), env) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("no such interpreter" in w for w in warnings)
    assert any(contract.GPU_IDLE_MINUTES_VAR in w for w in warnings)


def test_the_real_spawn_runs_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[list[str], dict[str, Any]]] = []
    gpuwatch.spawn("/runs/x", "n1", WatchSettings(30, 60.5, 15), 123, env={"A": "1"},
                   popen=lambda argv, **kw: calls.append((argv, kw)))
    argv, kw = calls[0]
    from train.common.entry import module_argv

    assert argv[:3] == module_argv(sys.executable, "train.node.gpuwatch")
    assert argv[3:] == ["--out", "/runs/x", "--node", "n1", "--interval", "30",
                        "--idle-threshold", "60.5", "--idle-minutes", "15", "--parent", "123"]
    assert kw["stdout"] == subprocess.DEVNULL and kw["env"] == {"A": "1"}


# -- a real GPU --------------------------------------------------------------------------

@pytest.mark.gpu
def test_real_gpus_are_sampled_through_nvml(tmp_path: Path) -> None:
    import pynvml

    rc = watch(pynvml, tmp_path, "real", WatchSettings(0.05, 10, 30), max_samples=3,
               visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
    assert rc == 0
    rows = _rows(csv_path(tmp_path, "real"))
    gpus = {r[1] for r in rows}
    assert gpus and len(rows) == 3 * len(gpus)
    for _, _, util, used, total in rows:
        assert 0 <= int(util) <= 100 and 0 <= int(used) <= int(total) and int(total) > 0
    node = summary(tmp_path)["real"]
    assert node["samples"] == 3 and node["gpus"] == len(gpus)


def test_torchruns_agent_stopped_by_a_signal_is_no_unexpected_failure(
        launchable: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    """scancel's TERM reaches torch's agent, which raises SignalException once it has
    stopped the workers: the launcher says so and exits 128+N, no traceback."""
    import torch.distributed.run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    def stopped(argv: list[str]) -> None:
        raise SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)

    monkeypatch.setattr(torch.distributed.run, "main", stopped)
    rc = launch(LaunchOptions(mode="torchrun", command=[sys.executable, "-m", "x"]),
                _step_env(0, 0, 1))
    assert rc == 128 + signal.SIGTERM
    assert launchable[0][-1].terminated  # the sampler was stopped too


@pytest.mark.parametrize(("stop", "said"), [
    ("none", "the job gives them no stop signal: what they saved before it is kept"),
    ("USR1", "their stop signal is USR1: what they saved before it is kept"),
    ("TERM", "it is their stop signal (TERM): they save on it where they handle it")])
def test_the_agents_stop_says_the_workers_save_only_where_term_is_theirs(
        launchable: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, stop: str, said: str) -> None:
    """Issue 39: a kill stop's TERM (stop mode kill: the workers have no handler) was logged
    as the workers checkpointing on it."""
    import torch.distributed.run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    def stopped(argv: list[str]) -> None:
        raise SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)

    monkeypatch.setattr(torch.distributed.run, "main", stopped)
    with caplog.at_level(logging.WARNING):
        launch(LaunchOptions(mode="torchrun", command=[sys.executable, "-m", "x"]),
               {**_step_env(0, 0, 1), "TRAIN_STOP_SIGNAL": stop})
    assert said in caplog.text and "checkpoint on it" not in caplog.text, caplog.text
