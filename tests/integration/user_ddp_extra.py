"""A researcher's DDP script with one dependency of its own: `tabulate`, from PyPI, which
the base image lacks and a derived image (`train image new --requirements`) adds. No
`train` import. Every rank imports the package, takes part in one allreduce over gloo,
prints a table of the result and writes where the package came from into TRAIN_RUN_DIR
(rank-N.txt: version, module file, allreduced sum)."""

import os
import sys
from pathlib import Path

import tabulate
import torch
import torch.distributed as dist


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)  # 1 + 2 + ... + world on every rank
    row = [[rank, world, int(total.item()), tabulate.__version__]]
    print(tabulate.tabulate(row, headers=["rank", "world", "allreduce", "tabulate"]),
          flush=True)
    out = Path(os.environ.get("TRAIN_RUN_DIR", "."))
    (out / f"rank-{rank}.txt").write_text(
        f"{tabulate.__version__} {tabulate.__file__} {int(total.item())}\n")
    dist.barrier()
    # torch 2.13's gloo can abort a rank whose peer tears the group down first (see
    # user_ddp.py): the results are written, so leave without the group's destructor
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
