"""A researcher's own causal-LM script on Hugging Face's Trainer, in run_clm.py's shape:
HfArgumentParser over its own arguments and TrainingArguments (so `--resume_from_checkpoint
DIR` is the only way it resumes), a tiny GPT-2 built from its config (2 layers, width 32),
a word-level tokenizer trained on the local text and wrapped in PreTrainedTokenizerFast, no
hub (HF_HUB_OFFLINE=1, TRANSFORMERS_OFFLINE=1), no idea of Slurm or TRAIN_*. At the end:
the model, all_results.json (train_loss, ...) and trainer_state.json in --output_dir.

The Trainer has no signal handler: StopOnSignal is the usual callback (USR1 or TERM: save
at the end of the step, stop, exit 0).

For the tests, what each process did goes to --log_dir: its argv and TRAIN_CHUNK
(runs.log), one line per step ("PID STEP"). After --block_after steps in one process it
stands still until a stop signal comes, writing LOG_DIR/blocked.PID first: work counted,
never timed. --fail_at_step N raises on every rank at the end of step N.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    HfArgumentParser,
    PreTrainedTokenizerFast,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    set_seed,
)


@dataclass
class ScriptArguments:
    train_file: str = field(default="corpus.txt")
    block_size: int = field(default=16)
    log_dir: str = field(default="log")
    block_after: int = field(default=0)
    fail_at_step: int = field(default=0)


class StopOnSignal(TrainerCallback):
    """The walltime signal (USR1, or the TERM of --stop-mode kill): save at the end of the
    current step and stop; the script then exits 0."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if self.requested:
            control.should_save = True
            control.should_training_stop = True
        return control


class TestLog(TrainerCallback):
    """(test knobs) each step to LOG_DIR/steps.log; --fail_at_step; after --block_after
    steps in this process, stand still until a stop signal comes."""

    def __init__(self, log_dir: Path, block_after: int, fail_at: int,
                 stop: StopOnSignal) -> None:
        self.log_dir, self.block_after, self.fail_at = log_dir, block_after, fail_at
        self.stop = stop
        self.done_here = 0

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.done_here += 1
        if state.is_world_process_zero:
            with open(self.log_dir / "steps.log", "a", encoding="utf-8") as fh:
                fh.write(f"{os.getpid()} {state.global_step}\n")
        if state.global_step == self.fail_at:
            raise RuntimeError(f"rank {args.process_index}: a bad batch at step "
                               f"{state.global_step}")
        if self.done_here == self.block_after and state.global_step < state.max_steps:
            (self.log_dir / f"blocked.{os.getpid()}").write_text(str(state.global_step))
            while not self.stop.requested:
                time.sleep(0.1)
        return control


class Blocks(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, ids: list[int], size: int) -> None:
        self.rows = [ids[i:i + size] for i in range(0, len(ids) - size + 1, size)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = torch.tensor(self.rows[i])
        return {"input_ids": row, "labels": row.clone()}


UNKNOWN, END = "[UNK]", "[EOS]"


def tokenizer_for(text: str) -> PreTrainedTokenizerFast:
    """A word-level tokenizer trained on the text itself (a few hundred words)."""
    tok = Tokenizer(models.WordLevel(unk_token=UNKNOWN))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([text], trainers.WordLevelTrainer(
        vocab_size=400, special_tokens=[UNKNOWN, END]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=UNKNOWN, eos_token=END,
                                   pad_token=END)


def main() -> None:
    parser = HfArgumentParser((ScriptArguments, TrainingArguments))
    script, args = parser.parse_args_into_dataclasses()
    log_dir = Path(script.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    if args.process_index == 0:
        with open(log_dir / "runs.log", "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "argv": sys.argv[1:],
                                 "chunk": os.environ.get("TRAIN_CHUNK")}) + "\n")
    set_seed(args.seed)
    text = Path(script.train_file).read_text(encoding="utf-8")
    tokenizer = tokenizer_for(text)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=script.block_size, n_embd=32,
                        n_layer=2, n_head=2, bos_token_id=tokenizer.eos_token_id,
                        eos_token_id=tokenizer.eos_token_id)
    model = GPT2LMHeadModel(config)
    data = Blocks(tokenizer(text)["input_ids"], script.block_size)
    stop = StopOnSignal()
    test_log = TestLog(log_dir, script.block_after, script.fail_at_step, stop)
    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                      callbacks=[test_log, stop])
    result = trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    if stop.requested:  # saved at the signal: the next run goes on from it
        print(f"stopped by the signal at step {trainer.state.global_step}", flush=True)
        return
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    print(f"finished at step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
