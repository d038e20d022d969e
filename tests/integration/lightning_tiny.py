"""A tiny Lightning model, trained as a user would: DDP on CPU across nodes, one rank per
task, Lightning's own SLURM support left on (it saves an `hpc_ckpt` on the walltime USR1,
asks `scontrol requeue`, and resumes from that checkpoint when the job starts again).

Test knobs (environment): PL_EPOCHS (default 2); PL_HOLD_AT makes the first chunk wait
after that many steps, still answering signals, so a test can send the walltime signal
with work left (counted in steps, never in seconds).
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
    """In chunk 1, wait after PL_HOLD_AT steps until Lightning has been told to stop."""

    def __init__(self, at: int, run_dir: Path) -> None:
        self.at, self.run_dir = at, run_dir

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if not self.at or os.environ.get("TRAIN_CHUNK", "1") != "1" \
                or trainer.global_step != self.at:
            return
        if trainer.is_global_zero:
            (self.run_dir / "pl_held").write_text(str(trainer.global_step))
        while not trainer.received_sigterm:
            time.sleep(0.1)


if __name__ == "__main__":
    torch.manual_seed(0)
    run_dir = Path(os.environ.get("TRAIN_RUN_DIR", "."))
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = L.Trainer(accelerator="cpu", devices=1, num_nodes=2, strategy="ddp",
                        max_epochs=int(os.environ.get("PL_EPOCHS", "2")), logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(run_dir),
                        callbacks=[Hold(int(os.environ.get("PL_HOLD_AT", "0")), run_dir)])
    trainer.fit(Tiny(), DataLoader(data, batch_size=8))
    weight = float(trainer.lightning_module.layer.weight.detach().sum())
    print(f"lightning rank {trainer.global_rank}/{trainer.world_size} joined; "
          f"weight sum {weight:.6f}; global step {trainer.global_step}", flush=True)
    # the known gloo trap on CPU (docs/your-program.md): a rank can abort at the very end
    # when its peer tears the group down first; leave as the docs advise, once all is out
    os._exit(0)
