"""A program in the shape of Hugging Face's Trainer (`run_clm.py`), without transformers:
`--output_dir`, `--save_steps`, `--max_steps`, a save every --save_steps steps to
OUTPUT_DIR/checkpoint-N/ (model file first, trainer_state.json last, with global_step and
max_steps as the Trainer writes them: json.dump, indent 2, sorted keys), resumed only with
`--resume_from_checkpoint DIR`, no signal handler, and no idea of Slurm or TRAIN_*.

For the tests, what each process did goes to --log_dir: its argv and TRAIN_CHUNK (runs.log),
one line per step ("PID STEP"). After --block_after steps in one process it stands still
until it is killed, writing LOG_DIR/blocked.PID first: work counted, never timed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--output_dir", default="out")
parser.add_argument("--save_steps", type=int, default=5)
parser.add_argument("--max_steps", type=int, default=30)
parser.add_argument("--resume_from_checkpoint")
parser.add_argument("--log_dir", default="log")
parser.add_argument("--block_after", type=int, default=0)
args = parser.parse_args()

out, log_dir = Path(args.output_dir), Path(args.log_dir)
out.mkdir(parents=True, exist_ok=True)
log_dir.mkdir(parents=True, exist_ok=True)
pid = os.getpid()
with open(log_dir / "runs.log", "a", encoding="utf-8") as fh:
    fh.write(json.dumps({"pid": pid, "argv": sys.argv[1:],
                         "chunk": os.environ.get("TRAIN_CHUNK")}) + "\n")


def state(step: int) -> str:
    return json.dumps({"epoch": step / args.max_steps, "global_step": step,
                       "log_history": [{"loss": 1.0, "step": step}],
                       "max_steps": args.max_steps, "save_steps": args.save_steps},
                      indent=2, sort_keys=True) + "\n"


step = 0
if args.resume_from_checkpoint:
    step = json.loads((Path(args.resume_from_checkpoint) / "trainer_state.json")
                      .read_text(encoding="utf-8"))["global_step"]
    print(f"resuming from {args.resume_from_checkpoint} at step {step}", flush=True)
done_here = 0
while step < args.max_steps:
    step += 1
    done_here += 1
    with open(log_dir / "steps.log", "a", encoding="utf-8") as fh:
        fh.write(f"{pid} {step}\n")
    if step % args.save_steps == 0:
        folder = out / f"checkpoint-{step}"
        folder.mkdir(exist_ok=True)
        (folder / "model.safetensors").write_text(str(step), encoding="utf-8")
        (folder / "trainer_state.json").write_text(state(step), encoding="utf-8")
        print(f"saved {folder}", flush=True)
    if done_here == args.block_after and step < args.max_steps:
        (log_dir / f"blocked.{pid}").write_text(str(step), encoding="utf-8")
        while True:
            time.sleep(1)
(out / "trainer_state.json").write_text(state(step), encoding="utf-8")
print(f"finished at step {step}", flush=True)
