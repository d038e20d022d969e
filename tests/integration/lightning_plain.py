"""A tiny Lightning script as most are written: a bare `Trainer(...)` with no
default_root_dir, so Lightning saves its SLURM checkpoints (hpc_ckpt_N.ckpt) in its default
root and restores the newest one there whenever the job starts under Slurm. It leaves by
os._exit once all is out, as docs/your-program.md advises for CPU jobs over gloo.

Test knobs (environment): PL_HOLD_AT makes chunk 1 wait after that many steps, answering
signals, until Lightning has been told to stop (counted in steps, never in seconds).
"""

import os
import time
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Hold(L.Callback):
    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_start(self, trainer, module) -> None:
        print(f"plain rank {trainer.global_rank} starts at global step "
              f"{trainer.global_step}", flush=True)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if not self.at or os.environ.get("TRAIN_CHUNK", "1") != "1" \
                or trainer.global_step != self.at:
            return
        if trainer.is_global_zero:
            Path(os.environ["TRAIN_RUN_DIR"], "pl_held").write_text(str(trainer.global_step))
        while not trainer.received_sigterm:
            time.sleep(0.1)


if __name__ == "__main__":
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = L.Trainer(accelerator="cpu", devices=1, num_nodes=2, strategy="ddp",
                        max_epochs=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[Hold(int(os.environ.get("PL_HOLD_AT", "0")))])
    trainer.fit(Tiny(), DataLoader(data, batch_size=8))
    print(f"plain rank {trainer.global_rank}/{trainer.world_size} root "
          f"{trainer.default_root_dir}; global step {trainer.global_step}", flush=True)
    # the known gloo trap on CPU (docs/your-program.md): a rank can abort at the very end
    # when its peer tears the group down first; leave as the docs advise, once all is out
    os._exit(0)
