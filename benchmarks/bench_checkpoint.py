"""Checkpoint cost: how long the training loop is blocked per checkpoint (snapshot, then a
background write: encoding for safe loading, atomic file, sha256 beside it) against a plain
synchronous torch.save of the same state, and the time to resume (checksum verified, loaded
with weights_only=True, decoded, restored) against a plain torch.load(weights_only=False)
of the plain file. Goals: blocked <= 0.25x the plain save; resume <= 1.2x the plain load
plus the restore."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import machine, median, short, timed, write_section
from train.node.distributed import DistContext
from train.workloads.config import RunConfig
from train.workloads.dqn.trainer import SeedRun
from train.workloads.runtime.precision import select_precision


def filled_run(res: int, replay: int, out: Path) -> SeedRun:
    cfg = RunConfig(res=res, replay_size=replay, out=str(out))
    run = SeedRun(cfg, 4, DistContext(device=torch.device("cpu")),
                  select_precision("fp32", "cpu"))
    run.agent.dummy_step()
    obs = run.env.reset()
    rng = np.random.default_rng(0)
    for _ in range(replay):  # a full buffer: the worst case for a checkpoint
        action = run.env.scripted_action() if rng.random() < 0.5 else 0
        nxt, r, t, over = run.env.step(action)
        run.replay.add(obs, action, r, t, nxt)
        obs = run.env.reset() if over else nxt
    run.checkpoints.prepare()
    return run


def measure(res: int, replay: int, rounds: int = 5, loads: int = 3) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        run = filled_run(res, replay, Path(tmp) / "run")
        state_for_plain = {"agent": run.agent.state_dict(), "ranks": [run._local_state()]}
        plain_path = Path(tmp) / "plain.pt"
        blocked, plain, total = [], [], []
        for i in range(rounds):
            run.episode = i + 1
            blocked.append(timed(run.save))
            total.append(blocked[-1] + timed(run.checkpoints.wait))
            plain.append(timed(lambda: torch.save(state_for_plain, plain_path)))
        size = run.checkpoints.complete()[-1].stat().st_size
        fresh = SeedRun(run.cfg, 4, DistContext(device=torch.device("cpu")),
                        select_precision("fp32", "cpu"))
        resume = median([timed(fresh.restore) for _ in range(loads)])
        assert fresh.episode == rounds

        def plain_resume() -> None:  # the unsafe, unverified load it replaces, same restore
            state = torch.load(plain_path, map_location="cpu", weights_only=False)
            fresh.agent.load_state_dict(state["agent"])
            fresh._restore_local(state["ranks"][0])

        baseline = median([timed(plain_resume) for _ in range(loads)])
    return {"blocked": median(blocked), "plain": median(plain), "write": median(total),
            "resume": resume, "plain_resume": baseline, "mb": size / 2**20}


def main() -> None:
    torch.set_num_threads(2)
    load = os.getloadavg()[0]  # other work on the machine, shown beside the figures
    rows = []
    for res, replay in ((16, 500),) if short() else ((16, 20000), (32, 20000)):
        m = measure(res, replay, *((2, 1) if short() else ()))
        rows.append(f"| {res} | {replay} | {m['mb']:.0f} | {m['blocked'] * 1000:.0f} | "
                    f"{m['plain'] * 1000:.0f} | {m['blocked'] / m['plain']:.3f} | "
                    f"{m['write'] * 1000:.0f} | {m['resume'] * 1000:.0f} | "
                    f"{m['plain_resume'] * 1000:.0f} | {m['resume'] / m['plain_resume']:.2f} |")
    body = "\n".join([
        "## Checkpoint blocking time and resume (goals: blocked <= 0.25x a plain synchronous "
        "torch.save; resume <= 1.2x a plain unverified torch.load and the same restore)",
        "",
        f"Machine: {machine()}; load average {load:.1f} at the start. Full replay buffer "
        "(the worst case); median of 5 checkpoints. 'blocked' is what the training loop "
        "waits for (snapshot + hand-off); the background write adds the encoding for safe "
        "loading, fsync, the sha256 file and two renames (checksum, then data) with a "
        "directory fsync after each. 'resume' verifies the newest checkpoint's sha256, loads "
        "it with weights_only=True, decodes it and restores agent, replay, game and RNGs; "
        "'plain resume' is torch.load(weights_only=False) of the plain file and the same "
        "restore.",
        "",
        "| res | replay | checkpoint MiB | blocked ms | plain torch.save ms | ratio | "
        "background write ms | resume ms | plain resume ms | resume ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
    ])
    write_section("checkpoint", body)


if __name__ == "__main__":
    main()
