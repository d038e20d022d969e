"""No secret reaches config.json, the launcher's log or a job script: over 30 secret-bearing
names and values through `train run`, `train launch` and `train render`/`train submit`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from train.errors import ConfigError
from train.secrets import REDACTED, masked_argv, recorded_environment, redact_text
from train.slurm.job import check_env_item

# name -> a value no output may contain (each value unique, so a leak is traced to its name)
SECRET_NAMES = {
    "SLURM_JWT": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJqd3QtdXNlciJ9.c2lnbmF0dXJlMQ",
    "SLURM_AUTH_INFO": "socket=/x,ttl=60,secret-auth-01",
    "SLURM_DB_PASS": "db-pass-02",
    "SLURM_ACCOUNTING_STORAGE_PASS": "acct-pass-03",
    "SLURM_API_TOKEN": "api-token-04",
    "SLURM_SESSION_KEY": "session-key-05",
    "SLURM_PRIVATE_DATA": "private-06",
    "SLURM_SITE_THING": "site-thing-07",  # not on the allowlist: present, redacted
    "NCCL_IB_PASSWD": "ib-passwd-08",
    "NCCL_SECRET_KEY": "nccl-secret-09",
    "NCCL_AUTH_TOKEN": "nccl-token-10",
    "NCCL_NEW_KNOB": "nccl-knob-11",
    "CUDA_PASSWORD_HINT": "cuda-pass-12",
    "CUDA_MPS_AUTH": "cuda-auth-13",
    "PYTORCH_CREDENTIALS": "pt-cred-14",
    "PYTORCH_API_KEY": "pt-key-15",
    "TORCH_HUB_TOKEN": "hub-token-16",
    "TORCH_SIGNATURE": "torch-sig-17",
    "SLURMD_SECRET": "slurmd-secret-18",
    "NCCL_COOKIE": "nccl-cookie-19",
    "SLURM_BEARER": "slurm-bearer-20",
}
# allowed names whose values carry credentials: only those parts are redacted
SECRET_VALUES = {
    "SLURM_JOB_NAME": ("run token=tok-value-21 end", "token=<redacted>"),
    "SLURM_SUBMIT_DIR": ("/home/u/password=pw-value-22", "password=<redacted>"),
    "SLURM_CLUSTER_NAME": ("api_key: ak-value-23", "api_key: <redacted>"),
    "NCCL_DEBUG_FILE": ("/tmp/auth=au-value-24", "auth=<redacted>"),
    "SLURM_JOB_QOS": ("Bearer bearer-value-25-long", REDACTED),
    "NCCL_SOCKET_IFNAME": ("eyJhbGciOiJub25lIn0.eyJ2YWx1ZSI6MjZ9.sig-value-26", REDACTED),
    "CUDA_CACHE_PATH": ("/c?secret=sc-value-27", "secret=<redacted>"),
    "SLURM_JOB_RESERVATION": ("pwd=pwd-value-28", "pwd=<redacted>"),
}
ARGV_SECRETS = {"--wandb-key": "wandb-value-29", "--api-token": "api-value-30",
                "--hf-token": "hf-value-31", "--password": "pw-value-32"}
LEAKS = ([*SECRET_NAMES.values()] + [v for v, _ in SECRET_VALUES.values()]
         + [*ARGV_SECRETS.values()])
# what must be found verbatim
SAFE = {"SLURM_JOB_ID": "4242", "NCCL_DEBUG": "WARN", "CUDA_VISIBLE_DEVICES": "",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def _environ() -> dict[str, str]:
    return {**SECRET_NAMES, **{k: v for k, (v, _) in SECRET_VALUES.items()}, **SAFE}


def _no_leak(text: str) -> None:
    leaked = [v for v in LEAKS if v in text or (v.split("-value")[0] + "-value" in text
              and v in text)]
    assert leaked == [], leaked
    for fragment in ("tok-value", "pw-value", "ak-value", "au-value", "wandb-value",
                     "api-value", "hf-value", "sc-value"):
        assert fragment not in text, fragment


def test_recorded_environment_allowlist_and_value_redaction() -> None:
    assert len(SECRET_NAMES) + len(SECRET_VALUES) + len(ARGV_SECRETS) >= 30
    snap = recorded_environment(_environ())
    for name in SECRET_NAMES:
        assert snap[name] == REDACTED, name
    for name, (_value, kept) in SECRET_VALUES.items():
        assert kept in snap[name], (name, snap[name])
    for name, value in SAFE.items():
        assert snap[name] == value
    _no_leak(json.dumps(snap))


def test_masked_argv_keeps_the_shape() -> None:
    argv = ["python", "fit.py", "--lr", "0.1"]
    for option, value in ARGV_SECRETS.items():
        argv += [option, value, f"{option}={value}"]
    masked = masked_argv(argv)
    assert masked[:4] == ["python", "fit.py", "--lr", "0.1"]
    assert masked[4:7] == ["--wandb-key", REDACTED, f"--wandb-key={REDACTED}"]
    _no_leak(" ".join(masked))
    assert redact_text("plain text: lr=0.1, seeds=4") == "plain text: lr=0.1, seeds=4"


def test_train_run_records_no_secret(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli(["run", "demo", "--device", "cpu", "--res", "6", "--episodes", "1",
                    "--eval-episodes", "0", "--episode-steps", "4", "--out", str(out)],
                   env=_environ())
    assert proc.returncode == 0, proc.stderr
    record = (out / "config.json").read_text()
    _no_leak(record + proc.stdout + proc.stderr)
    env = json.loads(record)["environment"]
    assert env["SLURM_JWT"] == REDACTED and env["SLURM_JOB_ID"] == "4242"


def test_train_launch_logs_no_secret(tmp_path: Path) -> None:
    command = ["python", "-c", "pass"]
    for option, value in ARGV_SECRETS.items():
        command += [option, value]
    proc = run_cli(["launch", "--mode", "single", "--", *command],
                   env={**_environ(), "SLURM_NNODES": "1", "SLURM_NODEID": "0",
                        "SLURM_JOB_NODELIST": "localhost", "SLURM_NTASKS": "1",
                        "SLURM_PROCID": "0"})
    assert proc.returncode == 0, proc.stderr
    assert f"--wandb-key {REDACTED}" in proc.stderr
    _no_leak(proc.stdout + proc.stderr)


@pytest.mark.parametrize("item", [*(f"{n}=x" for n in ("WANDB_API_KEY", "HF_TOKEN",
                                                         "MY_PASSWORD", "AWS_SECRET_KEY")),
                                  "NOTE=token=abc", "URL=https://x?password=p"])
def test_a_secret_value_is_never_written_into_a_job_script(item: str) -> None:
    with pytest.raises(ConfigError, match="looks like a secret"):
        check_env_item(item)
    name = item.split("=", 1)[0]
    assert check_env_item(name) == (name, None)  # by name it passes through


def test_render_and_submit_write_no_secret_of_the_submitting_shell(tmp_path: Path) -> None:
    proc = run_cli(["render", "--cluster", "local", "--env", "WANDB_API_KEY", "--", "demo",
                    "--episodes", "1"], env={**_environ(), "WANDB_API_KEY": "wandb-value-29"})
    assert proc.returncode == 0, proc.stderr
    _no_leak(proc.stdout)
    assert "WANDB_API_KEY" in proc.stdout  # passed through by name
    refused = run_cli(["submit", "--cluster", "local", "--env", "WANDB_API_KEY=wandb-value-29",
                       "--out", str(tmp_path / "runs"), "--", "demo"])
    assert refused.returncode == 2 and "looks like a secret" in refused.stderr
    assert not (tmp_path / "runs").exists()
