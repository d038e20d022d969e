"""No secret reaches config.json, the launcher's log or a job script: over 30 secret-bearing
names and values through `train run`, `train launch` and `train render`/`train submit`."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.conftest import run_cli
from train.client.slurm.jobitems import check_env_item
from train.common.errors import ConfigError
from train.common.secrets.commands import masked_argv, redact_text
from train.common.secrets.environment import masked_environment, recorded_environment
from train.common.secrets.names import REDACTED, is_secret_name

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
    # the host's Python set-up is recorded as process_env, through the same redaction
    host = {"CONDA_DEFAULT_ENV": "token=conda-value-33",
            "CONDA_PREFIX": "https://u:conda-value-34@h/env"}
    proc = run_cli(["run", "demo", "--device", "cpu", "--res", "6", "--episodes", "1",
                    "--eval-episodes", "0", "--episode-steps", "4", "--out", str(out)],
                   env={**_environ(), **host})
    assert proc.returncode == 0, proc.stderr
    record = (out / "config.json").read_text()
    _no_leak(record + proc.stdout + proc.stderr)
    assert "conda-value" not in record
    config = json.loads(record)
    env = config["environment"]
    assert env["SLURM_JWT"] == REDACTED and env["SLURM_JOB_ID"] == "4242"
    assert config["process_env"]["CONDA_DEFAULT_ENV"] == f"token={REDACTED}"
    assert config["process_env"]["CONDA_PREFIX"] == f"https://u:{REDACTED}@h/env"


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
    proc = run_cli(["render", "--cluster", "local", "--runtime", "none", "--env",
                    "WANDB_API_KEY", "--", "demo",
                    "--episodes", "1"], env={**_environ(), "WANDB_API_KEY": "wandb-value-29"})
    assert proc.returncode == 0, proc.stderr
    _no_leak(proc.stdout)
    assert "WANDB_API_KEY" in proc.stdout  # passed through by name
    refused = run_cli(["submit", "--cluster", "local", "--env", "WANDB_API_KEY=wandb-value-29",
                       "--out", str(tmp_path / "runs"), "--", "demo"])
    assert refused.returncode == 2 and "looks like a secret" in refused.stderr
    assert not (tmp_path / "runs").exists()



# --- command lines: what a hostile trial found masked_argv missed ---------------------------
# (argv, what it must become); every secret value holds "sv" (secret value), so a leak shows
MASKED_COMMANDS = {
    "bash -c body": (
        ["bash", "-c", "python fit.py --wandb-key sv-1 --lr 0.1 && run --token='sv 2' --x 1"],
        ["bash", "-c", f"python fit.py --wandb-key {REDACTED} --lr 0.1 && run "
                       f"--token={REDACTED} --x 1"]),
    "sh -c body, value quoted": (
        ["sh", "-c", 'train --api-token "sv 3 sv" --password=\'sv4\' --hf-token=sv5'],
        ["sh", "-c", f"train --api-token {REDACTED} --password={REDACTED} "
                     f"--hf-token={REDACTED}"]),
    "a body inside a body": (
        ["bash", "-lc", "ssh host 'python x.py --api-token sv-6 --n 3'"],
        ["bash", "-lc", f"ssh host 'python x.py --api-token {REDACTED} --n 3'"]),
    "--passphrase": (
        ["gpg", "--batch", "--passphrase", "sv-7", "--passphrase=sv-8", "-c", "f"],
        ["gpg", "--batch", "--passphrase", REDACTED, f"--passphrase={REDACTED}", "-c", "f"]),
    "mysql -pSECRET": (
        ["mysql", "-u", "root", "-psv-9", "db"], ["mysql", "-u", "root", f"-p{REDACTED}", "db"]),
    "mysql -p alone prompts: the next word is the database": (
        ["mysql", "-u", "root", "-p", "db"], ["mysql", "-u", "root", "-p", "db"]),
    "mysql in a body": (
        ["sh", "-c", "mysqldump -uroot -psv-10 db > d.sql; python -p 3"],
        ["sh", "-c", f"mysqldump -uroot -p{REDACTED} db > d.sql; python -p 3"]),
    "sshpass -p": (
        ["sshpass", "-p", "sv-11", "ssh", "h"], ["sshpass", "-p", REDACTED, "ssh", "h"]),
    "docker login -p": (
        ["docker", "login", "-u", "me", "-p", "sv-12", "ghcr.io"],
        ["docker", "login", "-u", "me", "-p", REDACTED, "ghcr.io"]),
    "redis-cli -a": (["redis-cli", "-a", "sv-13", "ping"], ["redis-cli", "-a", REDACTED, "ping"]),
    "curl -u user:password": (
        ["curl", "-u", "me:sv-14", "--user=me:sv-15", "-ume:sv-16", "--proxy-user", "p:sv-17",
         "https://h"],
        ["curl", "-u", f"me:{REDACTED}", f"--user=me:{REDACTED}", f"-ume:{REDACTED}",
         "--proxy-user", f"p:{REDACTED}", "https://h"]),
    "HTTP Basic and Bearer headers": (
        ["curl", "-H", "Authorization: Basic c3Y6c3YtMTg=", "-H",
         "Authorization: Bearer sv-19-long-enough", "-H", "X-Api-Key: sv-20", "https://h"],
        ["curl", "-H", f"Authorization: Basic {REDACTED}", "-H",
         f"Authorization: Bearer {REDACTED}", "-H", f"X-Api-Key: {REDACTED}", "https://h"]),
    "a Basic credential alone": (
        ["wget", "--header=Proxy-Authorization: basic c3Y6c3YtMjE="],
        ["wget", f"--header=Proxy-Authorization: basic {REDACTED}"]),
    "URL userinfo: the user kept": (
        ["git", "clone", "https://x-access-token:sv-22@github.com/o/r.git",
         "postgres://u:sv-23@db:5432/x?sslmode=require", "redis://:sv-24@h:6379/0"],
        ["git", "clone", f"https://x-access-token:{REDACTED}@github.com/o/r.git",
         f"postgres://u:{REDACTED}@db:5432/x?sslmode=require", f"redis://:{REDACTED}@h:6379/0"]),
    "JSON-shaped tokens": (
        ["python", "-c", 'print({"token": "sv-25", "n": 1})', '{"api_key":"sv-26","x":"y"}',
         "--cfg={'secret': 'sv 27'}"],
        ["python", "-c", f'print({{"token": "{REDACTED}", "n": 1}})',
         f'{{"api_key":"{REDACTED}","x":"y"}}', f"--cfg={{'secret': '{REDACTED}'}}"]),
    "well-known token formats": (
        ["git", "clone", "https://ghp_sv28abcdefghijklmnopqrstuvwxyz0123@github.com/o/r",
         "HF=hf_sv29abcdefghijklmnopqrstuvwxyz0123"],
        ["git", "clone", f"https://{REDACTED}@github.com/o/r", f"HF={REDACTED}"]),
}


@pytest.mark.parametrize("case", MASKED_COMMANDS)
def test_masked_argv_masks_what_a_hostile_trial_found(case: str) -> None:
    argv, expected = MASKED_COMMANDS[case]
    masked = masked_argv(argv)
    assert masked == expected
    assert "sv-" not in " ".join(masked) and "sv " not in " ".join(masked)
    assert redact_text(" ".join(masked)) == " ".join(masked)  # masking twice: the same


def test_a_secret_option_does_not_hide_the_next_option() -> None:
    # --private is a switch whose name looks secret: the option after it is not its value
    assert masked_argv(["fit.py", "--private", "--lr", "1", "--token", "--", "x"]) == [
        "fit.py", "--private", "--lr", "1", "--token", "--", "x"]


# --- names and values that are not secrets -------------------------------------------------
NOT_SECRET_NAMES = ["--key-frames", "--keyframe", "--keyframes", "SESSION_NAME",
                    "--session-name", "--session-dir", "NCCL_CUMEM_ENABLE", "--monkey",
                    "--passes", "--bypass", "--author", "--keep-last", "--max-keys",
                    "--num-keys", "--pass-through", "--no-auth", "--auth-type", "--sort-key",
                    "PRIMARY_KEY", "--pad-token", "EOS_TOKEN_ID", "--max-tokens",
                    "--tokenizer", "--password-stdin", "--ask-pass", "PWD", "OLDPWD",
                    "--key-size", "TOKEN_URL"]
SECRET_NAMES_TOO = ["SESSION_ID", "SESSION_TOKEN", "SESSION_KEY", "--session", "API_KEYS",
                    "PGPASSWORD", "MYSQL_PWD", "GITHUB_PAT", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY",
                    "GPG_PASSPHRASE", "--passphrase", "SSH_PRIVATE_KEY", "AWS_SESSION_TOKEN",
                    "apiKey", "clientSecret", "X-Api-Key", "--key", "--pass", "--auth",
                    "SLURM_DB_PASS", "GH_ACCESSTOKEN"]


@pytest.mark.parametrize("name", NOT_SECRET_NAMES)
def test_a_name_that_only_describes_or_counts_is_not_a_secret(name: str) -> None:
    assert not is_secret_name(name)
    if name.startswith("-"):
        argv = ["fit.py", name, "8", f"{name}=8", "--lr", "0.1"]
        assert masked_argv(argv) == argv
    else:
        assert redact_text(f"{name}=8 {name}: 8") == f"{name}=8 {name}: 8"


@pytest.mark.parametrize("name", SECRET_NAMES_TOO)
def test_secret_names_are_still_caught(name: str) -> None:
    assert is_secret_name(name)
    if name.startswith("-"):
        assert masked_argv([name, "sv-1"]) == [name, REDACTED]
    else:
        assert redact_text(f"{name}=sv-1") == f"{name}={REDACTED}"


def test_ordinary_values_are_kept() -> None:
    for text in ("keyframe=3 monkey=1 author=bob max_tokens=100 tokenizer=gpt2",
                 "session_name=exp1 sort_key=id passes=3 bypass=1",
                 "basic tutorial text", "12:30:00", "if token == x:", "PWD=/home/u",
                 "https://host:8443/path@v2", "/data/sk-a-long-slug-of-plain-words-and-more",
                 "python serve.py -p 8080", "docker run -p 8080:80 img"):
        assert redact_text(text) == text
    argv = ["docker", "run", "-p", "8080:80", "-u", "1000:1000", "img", "python", "-u", "x.py"]
    assert masked_argv(argv) == argv


# --- check_env_item: plurals, compounds and credentials in a value --------------------------
@pytest.mark.parametrize("item", [
    "API_KEYS=a,b", "PGPASSWORD=x", "MYSQL_PWD=x", "GITHUB_PAT=x", "HF_TOKEN=x",
    "AWS_SECRET_ACCESS_KEY=x", "GPG_PASSPHRASE=x", "SSH_PRIVATE_KEY=x", "SESSION_TOKEN=x",
    "DATABASE_URL=postgres://u:p@h/db", "CACHE_URL=redis://:p@h:6379/0",
    "PG_DSN=host=h user=u password=p", "EXTRA_ARGS=--wandb-key abc --lr 1",
    "NOTE={\"token\": \"abc\"}"])
def test_secret_compounds_and_credential_values_are_refused(item: str) -> None:
    with pytest.raises(ConfigError, match="looks like a secret") as refused:
        check_env_item(item)
    name = item.split("=", 1)[0]
    assert refused.value.field == "env"
    assert f"--env {name}" in str(refused.value) and "by name" in str(refused.value)
    assert check_env_item(name) == (name, None)


@pytest.mark.parametrize("item", ["SESSION_NAME=exp1", "NCCL_CUMEM_ENABLE=0",
                                  "DATABASE_URL=postgres://u@h/db", "KEY_FRAMES=8",
                                  "MAX_KEYS=100", "DATA_PATH=/a:/b"])
def test_settings_that_only_look_alike_pass(item: str) -> None:
    name, _, value = item.partition("=")
    assert check_env_item(item) == (name, value)


# --- process_env of config.json ------------------------------------------------------------
def test_masked_environment_redacts_names_and_values() -> None:
    env = {"PYTHONPATH": "/a:/b", "CONDA_PREFIX": None, "VIRTUAL_ENV": "https://u:sv-1@h/x",
           "CONDA_DEFAULT_ENV": "token=sv-2", "HF_TOKEN": "sv-3"}
    assert masked_environment(env) == {
        "PYTHONPATH": "/a:/b", "CONDA_PREFIX": None, "VIRTUAL_ENV": f"https://u:{REDACTED}@h/x",
        "CONDA_DEFAULT_ENV": f"token={REDACTED}", "HF_TOKEN": REDACTED}


# --- linear time ------------------------------------------------------------------------------
@pytest.mark.parametrize("unit", ["a.", "token='", "a://u:", "--token ", "-aB"])
def test_a_megabyte_of_hostile_input_finishes(unit: str) -> None:
    # shapes that make a backtracking pattern quadratic or worse: long runs of key-like
    # characters, open quotes, URL schemes, option names; this only has to end
    text = unit * ((1 << 20) // len(unit))
    assert len(redact_text(text)) > 0
    assert len(masked_argv(["x", text, "--token", text])) == 4


# --- what a second hostile review found passing (issue 18) ------------------------------------
# Each through every place the project masks or refuses secrets: masked_argv (the launcher's
# log, config.json's argv), redact_text of the same command line as text (a `bash -c` body,
# a recorded variable's value) and check_env_item (a value written into a job script).
HEX40 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b"
PASSED_BEFORE = {
    "a token as a URL's user, no colon": (
        ["git", "clone", f"https://{HEX40}@github.com/o/r.git"],
        ["git", "clone", f"https://{REDACTED}@github.com/o/r.git"]),
    "SSHPASS": (
        ["env", "SSHPASS=sv-1", "sshpass", "-e", "ssh", "h"],
        ["env", f"SSHPASS={REDACTED}", "sshpass", "-e", "ssh", "h"]),
    "wandb login KEY": (["wandb", "login", "sv-2"], ["wandb", "login", REDACTED]),
    "wandb login, options first": (
        ["wandb", "login", "--relogin", "--host", "https://wandb.example.org", "sv-3"],
        ["wandb", "login", "--relogin", "--host", "https://wandb.example.org", REDACTED]),
    "wandb login in a body": (
        ["bash", "-c", "wandb login sv-4 && python fit.py"],
        ["bash", "-c", f"wandb login {REDACTED} && python fit.py"]),
    "aws configure set": (
        ["aws", "configure", "set", "aws_secret_access_key", "sv-5"],
        ["aws", "configure", "set", "aws_secret_access_key", REDACTED]),
    "aws configure set, a profile's key": (
        ["aws", "configure", "set", "profile.dev.aws_session_token", "sv-6", "--profile", "dev"],
        ["aws", "configure", "set", "profile.dev.aws_session_token", REDACTED, "--profile",
         "dev"]),
    "aws configure in a body": (
        ["sh", "-c", "aws configure set aws_secret_access_key sv-7; aws s3 ls"],
        ["sh", "-c", f"aws configure set aws_secret_access_key {REDACTED}; aws s3 ls"]),
    "--password with spaces": (
        ["fit.py", "--password", "correct horse sv-8"], ["fit.py", "--password", REDACTED]),
    "--password with spaces in a body": (
        ["bash", "-c", 'fit.py --password "correct horse sv-9" --lr 1'],
        ["bash", "-c", f"fit.py --password {REDACTED} --lr 1"]),
    "PASSWORD='a b c' in a body": (
        ["bash", "-c", "PASSWORD='a b sv-10' fit.py"],
        ["bash", "-c", f"PASSWORD={REDACTED} fit.py"]),
    "PASSWORD=a b c, one word (env, a launcher)": (
        ["env", "PASSWORD=a b sv-11", "fit.py"], ["env", f"PASSWORD={REDACTED}", "fit.py"]),
    "a Hydra override with spaces": (
        ["python", "fit.py", "db.password=correct horse sv-12"],
        ["python", "fit.py", f"db.password={REDACTED}"]),
    "escaped spaces in a body": (
        ["bash", "-c", "PASSWORD=a\\ b\\ sv-13 fit.py"],
        ["bash", "-c", f"PASSWORD={REDACTED} fit.py"]),
    "an unquoted assignment in a body keeps the command": (
        ["bash", "-c", "PASSWORD=sv-17 fit.py --lr 1"],
        ["bash", "-c", f"PASSWORD={REDACTED} fit.py --lr 1"]),
    "ANSI-C quoting in a body": (
        ["bash", "-c", "PASSWORD=$'a b sv-14' fit.py"],
        ["bash", "-c", f"PASSWORD={REDACTED} fit.py"]),
    "password: with spaces (a YAML line)": (
        ["fit.py", "--cfg", "password: correct horse sv-15"],
        ["fit.py", "--cfg", f"password: {REDACTED}"]),
    "password = with spaces (an INI line)": (
        ["fit.py", "--cfg", "db_password = correct horse sv-16"],
        ["fit.py", "--cfg", f"db_password = {REDACTED}"]),
}


def _leaks(text: str) -> list[str]:
    return [word for word in ("sv-", "sv ", HEX40, "horse") if word in text]


@pytest.mark.parametrize("case", PASSED_BEFORE)
def test_what_passed_before_is_masked_everywhere(case: str) -> None:
    argv, expected = PASSED_BEFORE[case]
    masked = masked_argv(argv)
    assert masked == expected  # the launcher's log and config.json's argv
    assert _leaks(" ".join(masked)) == []
    assert masked_argv(masked) == masked  # masking twice: the same
    line = shlex.join(argv)  # the same command line as text
    assert _leaks(redact_text(line)) == [], redact_text(line)
    assert _leaks(masked_environment({"EXTRA": line})["EXTRA"] or "") == []
    with pytest.raises(ConfigError, match="looks like a secret"):  # a job script
        check_env_item(f"EXTRA_ARGS={line}")


def test_sshpass_is_a_secret_name_everywhere() -> None:
    assert is_secret_name("SSHPASS") and is_secret_name("DBPASS")
    assert masked_environment({"SSHPASS": "sv-1"}) == {"SSHPASS": REDACTED}
    assert redact_text("SSHPASS=sv-1 sshpass -e ssh h") == f"SSHPASS={REDACTED} sshpass -e ssh h"
    with pytest.raises(ConfigError, match="looks like a secret"):
        check_env_item("SSHPASS=sv-1")
    assert check_env_item("SSHPASS") == ("SSHPASS", None)
    for name in ("--bypass", "COMPASS", "--multipass", "TWOPASS", "ONEPASS"):
        assert not is_secret_name(name), name


# ordinary arguments that look like the cases above and must stay as they are
LOOK_ALIKE = [
    ["git", "clone", "ssh://git@github.com/o/r.git"],
    ["git", "clone", "https://bob@example.org/o/r.git", "git@github.com:o/r.git"],
    ["pip", "install", "git+https://deploy-bot-2024@gitlab.example.org/o/r.git"],
    ["git", "clone", "https://abcdefghijklmnopqrstuvwxyzabcdefgh@h/o/r.git"],  # no digit
    ["wandb", "login", "--relogin"], ["wandb", "sync", "runs/1"], ["wandb", "login"],
    ["python", "login.py", "key-frames"], ["docker", "login", "ghcr.io"],
    ["aws", "configure", "set", "region", "us-east-1"], ["aws", "configure", "list"],
    ["aws", "configure", "get", "aws_secret_access_key"],
    ["git", "config", "user.name", "Bob Smith"],
    ["python", "fit.py", "name: correct horse battery", "comment = a b c", "lr=0.1 0.2"],
    ["env", "DATA=a b c", "KEY_FRAMES=1 2", "python", "fit.py"],
    ["train", "submit", "--env", "PYTHONPATH=/scratch/fork", "--", "demo"],
    ["env", "PYTHONPATH=/scratch/fork:/home/u/lib", "python", "fit.py"],
]


@pytest.mark.parametrize("argv", LOOK_ALIKE, ids=lambda a: " ".join(a)[:40])
def test_ordinary_arguments_like_them_are_kept(argv: list[str]) -> None:
    assert masked_argv(argv) == argv
    line = shlex.join(argv)
    assert redact_text(line) == line
    check_env_item(f"EXTRA_ARGS={line}")  # written into a job script as it is


def test_pythonpath_is_no_secret() -> None:
    """`--env PYTHONPATH=/scratch/fork`: nothing here treats it as a secret (a refusal of it,
    if any, is about the batch shell's own variables, never 'looks like a secret')."""
    assert not is_secret_name("PYTHONPATH")
    assert redact_text("PYTHONPATH=/scratch/fork") == "PYTHONPATH=/scratch/fork"
    assert masked_environment({"PYTHONPATH": "/scratch/fork"}) == {
        "PYTHONPATH": "/scratch/fork"}
    try:
        check_env_item("PYTHONPATH=/scratch/fork")
    except ConfigError as exc:
        assert "looks like a secret" not in str(exc)


def test_train_launch_logs_none_of_what_passed_before() -> None:
    command = ["python", "-c", "pass"]
    for argv, _ in PASSED_BEFORE.values():
        command += [*argv, ";"]
    proc = run_cli(["launch", "--mode", "single", "--", *command],
                   env={"SLURM_JOB_ID": "4242", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
                        "SLURM_JOB_NODELIST": "localhost", "SLURM_NTASKS": "1",
                        "SLURM_PROCID": "0"})
    assert proc.returncode == 0, proc.stderr
    assert "wandb login" in proc.stderr and "aws configure set" in proc.stderr
    assert _leaks(proc.stdout + proc.stderr) == []


@pytest.mark.parametrize("unit", ["a://0a", "a://" + HEX40, "wandb login ", "password: a ",
                                  "aws configure set token ", "p=a\\ ", "x = a "])
def test_a_megabyte_of_the_new_shapes_finishes(unit: str) -> None:
    text = unit * ((1 << 20) // len(unit))
    assert len(redact_text(text)) > 0
    assert len(masked_argv(["x", text, "--token", text])) == 4


# A password attached to a program's short option (mysql -pX, sshpass -pX) whose own text
# looks like a secret's name (secret, mytoken, apikey): the option's value, masked, and the
# word after it (a database, a command) kept. A hostile trial found the password kept and
# the next word masked in its place.
ATTACHED_LOOK_ALIKE = {
    "mysql -psecret": (["mysql", "-u", "root", "-psecret", "db"],
                       ["mysql", "-u", "root", f"-p{REDACTED}", "db"]),
    "mysql -pmytoken": (["mysqldump", "-pmytoken", "db"], ["mysqldump", f"-p{REDACTED}", "db"]),
    "mysql -p with = in it": (["mysql", "-psecret=sv-1", "db"], ["mysql", f"-p{REDACTED}", "db"]),
    "sshpass -psecretpw": (["sshpass", "-psecretpw", "ssh", "h"],
                           ["sshpass", f"-p{REDACTED}", "ssh", "h"]),
    "in a body": (["sh", "-c", "mysql -psecret db < x.sql"],
                  ["sh", "-c", f"mysql -p{REDACTED} db < x.sql"]),
}


@pytest.mark.parametrize("case", ATTACHED_LOOK_ALIKE)
def test_an_attached_password_that_looks_like_a_name_is_masked(case: str) -> None:
    argv, expected = ATTACHED_LOOK_ALIKE[case]
    assert masked_argv(argv) == expected
    text = redact_text(shlex.join(argv))  # the same command line as text
    assert [w for w in ("secret", "mytoken", "sv-1") if w in text] == [], text
    assert text in (shlex.join(expected), " ".join(expected))  # the next word kept


# Credentials in shapes with no NAME=VALUE: a .netrc written by a setup command (wandb login
# writes one; `login USER password X`), an Azure SAS URL's signature (`sig=`, given to
# azcopy or in --env DATA_URL=...), a private key block. A hostile trial found all three
# kept as they were, and a SAS URL passed by --env written into the job script.
SAS = ("https://acct.blob.core.windows.net/data/shard.tar?sv=2022-11-02&ss=b&srt=o&sp=r"
       "&se=2026-12-01T00:00:00Z&sig=sv1Abc%2Bdef%3D")
NO_NAME_SHAPES = {
    "netrc on one line": ("machine api.wandb.ai login user password sv-1ab",
                          f"machine api.wandb.ai login user password {REDACTED}"),
    "netrc on lines": ("machine api.wandb.ai\n  login user\n  password sv-2ab\n",
                       f"machine api.wandb.ai\n  login user\n  password {REDACTED}\n"),
    "netrc, password before login": ("machine h password sv-3ab login u",
                                     f"machine h password {REDACTED} login u"),
    "Azure SAS": (SAS, SAS.replace("sv1Abc%2Bdef%3D", REDACTED)),
    "a private key": ("-----BEGIN OPENSSH PRIVATE KEY-----\nsv1b3BlbnNzaC1rZXktdjEAAAAA\n"
                      "-----END OPENSSH PRIVATE KEY-----",
                      f"-----BEGIN OPENSSH PRIVATE KEY-----\n{REDACTED}\n"
                      "-----END OPENSSH PRIVATE KEY-----"),
}


@pytest.mark.parametrize("case", NO_NAME_SHAPES)
def test_credentials_without_a_name_are_redacted(case: str) -> None:
    text, expected = NO_NAME_SHAPES[case]
    assert redact_text(text) == expected
    assert "sv1" not in " ".join(masked_argv(["bash", "-c", f"printf '{text}' > f"]))
    with pytest.raises(ConfigError, match="looks like a secret"):
        check_env_item(f"DATA={text}")


@pytest.mark.parametrize("text", [
    "password updated successfully", "login: alice", "the password prompt",
    "https://acct.blob.core.windows.net/data/shard.tar?sv=2022-11-02&sp=r",
    "--signal=USR1@120 sig=USR1", "-----BEGIN CERTIFICATE-----\nMIIBsz\n-----END CERTIFICATE-----",
    "ssh-keygen -t ed25519 -f key"])
def test_what_only_looks_like_them_is_kept(text: str) -> None:
    assert redact_text(text) == text


@pytest.mark.parametrize("unit", ["login a ", "machine ", "login " + "x" * 1000 + " ",
                                  "?sig=a", "-----BEGIN RSA PRIVATE KEY-----\n",
                                  "-----BEGIN PRIVATE KEY-----a"])
def test_a_megabyte_of_the_nameless_shapes_finishes(unit: str) -> None:
    text = unit * ((1 << 20) // len(unit))
    assert len(redact_text(text)) > 0
