"""A training program in nanoGPT's shape, without torch: `--key=value` flags, a checkpoint
(ckpt.json in --out_dir) written every --eval_interval iterations, resumed only when told
(`--init_from=resume`, which fails with no checkpoint), no signal handler, and no idea of
Slurm, chunks or TRAIN_*: a stop signal kills it (a TERM does not with --ignore_term=1).

For the tests, what each process did goes to --log_dir (never under --out_dir, which is
what the job names as its save path): one line per iteration ("PID ITER"), its argv and
TRAIN_CHUNK. After --block_after iterations in one process it stands still (a slow
iteration, say) until it is killed, writing LOG_DIR/blocked.PID first: work counted, never
timed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

config: dict[str, Any] = {"out_dir": "out", "log_dir": "log", "init_from": "scratch", "max_iters": 30,
          "eval_interval": 5, "block_after": 0, "ignore_term": 0}
for arg in sys.argv[1:]:  # nanoGPT's configurator: --key=value overrides a default
    key, sep, value = arg[2:].partition("=")
    if not arg.startswith("--") or not sep or key not in config:
        sys.exit(f"unknown argument {arg!r}")
    config[key] = type(config[key])(value)

if config["ignore_term"]:  # (some programs carry on through a TERM)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
out_dir, log_dir = Path(str(config["out_dir"])), Path(str(config["log_dir"]))
out_dir.mkdir(parents=True, exist_ok=True)
log_dir.mkdir(parents=True, exist_ok=True)
pid = os.getpid()
with open(log_dir / "runs.log", "a", encoding="utf-8") as fh:
    fh.write(json.dumps({"pid": pid, "argv": sys.argv[1:],
                         "chunk": os.environ.get("TRAIN_CHUNK")}) + "\n")

ckpt = out_dir / "ckpt.json"
iter_num = 0
if config["init_from"] == "resume":
    iter_num = json.loads(ckpt.read_text(encoding="utf-8"))["iter_num"]  # no file: fails
    print(f"resuming from iteration {iter_num}", flush=True)

done_here = 0
while iter_num < int(config["max_iters"]):
    iter_num += 1
    done_here += 1
    with open(log_dir / "iters.log", "a", encoding="utf-8") as fh:
        fh.write(f"{pid} {iter_num}\n")
    if iter_num % int(config["eval_interval"]) == 0:
        tmp = ckpt.with_suffix(".tmp")
        tmp.write_text(json.dumps({"iter_num": iter_num}), encoding="utf-8")
        tmp.replace(ckpt)
        print(f"saved checkpoint at iteration {iter_num}", flush=True)
    if done_here == int(config["block_after"]) and iter_num < int(config["max_iters"]):
        (log_dir / f"blocked.{pid}").write_text(str(iter_num), encoding="utf-8")
        while True:
            time.sleep(1)
print(f"finished at iteration {iter_num}", flush=True)
