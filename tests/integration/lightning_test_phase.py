"""A Lightning script whose final test phase is long: fit (a checkpoint at the end of each
epoch, as Lightning does by default), then `trainer.test`, on 2 nodes, one rank per task,
Lightning's own SLURM support left on (on USR1 it saves an hpc_ckpt and asks `scontrol
requeue`; it passes TERM by, and its test loop never stops early).

Test knob: while TRAIN_RUN_DIR/hold_test exists, the test phase stands still after its
second batch (rank 0 writes TRAIN_RUN_DIR/testing first): counted in batches, held by a
file the test controls, never timed.
"""

import os
import time
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

RUN_DIR = Path(os.environ.get("TRAIN_RUN_DIR", "."))


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.tested = 0

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def test_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self.layer(x), y), sync_dist=True)
        self.tested += 1
        if batch_idx == 1 and (RUN_DIR / "hold_test").exists():
            if self.trainer.is_global_zero:
                (RUN_DIR / "testing").write_text(str(self.trainer.global_step))
            while (RUN_DIR / "hold_test").exists():
                time.sleep(0.1)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = L.Trainer(accelerator="cpu", devices=1, num_nodes=2, strategy="ddp",
                        max_epochs=2, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(RUN_DIR))
    model = Tiny()
    trainer.fit(model, DataLoader(data, batch_size=8))
    trainer.test(model, DataLoader(data, batch_size=8))
    print(f"lightning rank {trainer.global_rank} tested {model.tested} batches; "
          f"global step {trainer.global_step}", flush=True)
    # the known gloo trap on CPU (docs/your-program.md): a rank can abort at the very end
    # when its peer tears the group down first; leave as the docs advise, once all is out
    os._exit(0)
