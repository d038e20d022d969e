"""GPU figures (run where a GPU is lent): bf16 and fp16 against fp32 update throughput, peak
memory per update, and the start-up cost of preallocating the optimizer state."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine, results_file, short, write_section
from bench_update import make_batch
from train.workloads.config import RunConfig
from train.workloads.dqn.agent import DQNAgent
from train.workloads.envs.spec import ObsSpec
from train.workloads.runtime.memory import preallocate, training_state_bytes
from train.workloads.runtime.precision import select_precision

SHAPES = ((32, 32),) if short() else ((32, 32), (32, 256), (64, 256))
STEPS = 10 if short() else 200


def measure(res: int, batch: int, precision: str, steps: int = STEPS) -> dict[str, float]:
    device = torch.device("cuda", 0)
    cap = torch.cuda.get_device_capability(device)
    torch.manual_seed(0)
    cfg = RunConfig(res=res, batch_size=batch, learning_starts=batch, replay_size=batch)
    torch.cuda.synchronize()
    agent = DQNAgent(ObsSpec(res), cfg, device, select_precision(precision, "cuda", cap))
    torch.cuda.synchronize()
    start = time.perf_counter()
    preallocate(agent.dummy_step, device=device, what="bench",
                state_bytes=training_state_bytes(agent.policy.parameters()))
    torch.cuda.synchronize()
    prealloc_s = time.perf_counter() - start
    b = agent.to_batch(make_batch(res, batch))
    for _ in range(2 if short() else 20):
        agent.update(b)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(steps):
        agent.update(b)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**20
    del agent, b
    torch.cuda.empty_cache()
    return {"ups": steps / elapsed, "peak": peak, "prealloc": prealloc_s}


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu needs a CUDA GPU")
    torch.zeros(1, device="cuda")  # CUDA context outside the timings
    rows = []
    for res, batch in SHAPES:
        results = {p: measure(res, batch, p) for p in ("fp32", "bf16", "fp16")}
        base = results["fp32"]["ups"]
        for name, r in results.items():
            rows.append(f"| {res} | {batch} | {name} | {r['ups']:.0f} | {r['ups'] / base:.2f} "
                        f"| {r['peak']:.1f} | {r['prealloc'] * 1000:.1f} |")
    body = "\n".join([
        "## GPU: mixed precision throughput, peak memory, preallocation cost",
        "",
        f"Machine: {machine()}. 200 timed updates after 20 warm-up ones; peak = "
        "max_memory_allocated over the timed updates; preallocation = the dummy "
        "forward/backward/step at full batch size at start-up (first kernels included).",
        "",
        "| res | batch | precision | updates/s | vs fp32 | peak MiB | preallocation ms |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ])
    write_section("gpu", body)
    out = os.environ.get("OUT")
    if out:
        shutil.copy(results_file(), Path(out) / "RESULTS.md")


if __name__ == "__main__":
    main()
