"""A script written for `accelerate launch`, as Hugging Face accelerate's examples are: no
`train` import, an Accelerator that takes the process group from what its launcher gave,
a gather across the group. Each process prints what accelerate made of the job."""

import os
import sys

import torch
from accelerate import Accelerator


def main() -> None:
    acc = Accelerator()
    ranks = acc.gather(torch.tensor([acc.process_index])).tolist()
    print(f"accelerate process {acc.process_index} of {acc.num_processes} "
          f"({acc.distributed_type.value}): gathered {sorted(ranks)}", flush=True)
    acc.wait_for_everyone()
    # torch 2.13's gloo can abort a rank whose peer tears the group down first (see
    # user_ddp.py): the result is printed, so leave without the group's destructor
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
