"""A researcher's own DDP training script, as one writes it from torch's tutorial: no
`train` import. It reads the usual launcher variables (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT, LOCAL_RANK), trains a linear model with gloo, and keeps the walltime contract
the README documents: on its stop signal (TRAIN_STOP_SIGNAL) it checkpoints into
TRAIN_RUN_DIR and exits 0; it resumes from that checkpoint; it exits 0 when the work is done.

Test knobs (environment): USER_STEPS total steps; USER_HOLD_AT makes the first chunk wait
there (still answering its stop signal, or until a file user_release appears) so a test
can stop it with work left, counted in steps, never in seconds; USER_NO_HANDLER leaves the signals at their default actions.
"""

import importlib.util
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

stop = {"signal": 0}


def on_stop(signum, frame):
    stop["signal"] = signum


def main() -> int:
    if not os.environ.get("USER_NO_HANDLER"):
        wanted = os.environ.get("TRAIN_STOP_SIGNAL", "USR1")
        if wanted != "none":
            signal.signal(getattr(signal, "SIG" + wanted), on_stop)
        ready = os.environ.get("TRAIN_SIGNAL_READY")
        if ready:  # the handler is in place: the walltime signal may come now
            Path(ready).touch()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"user script rank {rank}/{world} local {os.environ['LOCAL_RANK']} "
          f"master {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", flush=True)
    # (an image brought without `train`: the launcher bound in must stay out of sight)
    seen = importlib.util.find_spec("train") is not None
    print(f"user script rank {rank} can import train: {seen}", flush=True)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run_dir = Path(os.environ.get("TRAIN_RUN_DIR", "."))
    ckpt = run_dir / "user_ckpt.pt"
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt)
        model.module.load_state_dict(state["model"])
        start = state["step"]
        print(f"user script rank {rank} resumed at step {start}", flush=True)
    total = int(os.environ.get("USER_STEPS", "20"))
    hold = int(os.environ.get("USER_HOLD_AT", "0"))
    chunk = os.environ.get("TRAIN_CHUNK", "1")
    step = start
    while step < total:
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step * world + rank))
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        while hold and chunk == "1" and step == hold and not stop["signal"] \
                and not (run_dir / "user_release").exists():
            if rank == 0:
                (run_dir / "user_held").write_text(str(step))
            time.sleep(0.1)
        flag = torch.tensor([1 if stop["signal"] else 0])
        dist.all_reduce(flag)  # every rank stops at the same step
        if flag.item():
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "step": step}, ckpt)
                print(f"user script stopped by signal at step {step}", flush=True)
            dist.barrier()
            sys.stdout.flush()
            os._exit(0)  # (see the end of main)
    weight = float(model.module.weight.detach().sum())
    print(f"user script rank {rank} done at step {step}; weight sum {weight:.6f}", flush=True)
    dist.barrier()
    # torch 2.13's gloo can abort a rank ("terminate called without an active exception")
    # when its peer tears the group down first, even after a barrier: this script's
    # results are printed, so it leaves without running the group's destructor
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
