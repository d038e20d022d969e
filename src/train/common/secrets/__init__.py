"""What is recorded or logged of the environment and of command lines, without secrets.

- Variables of the recorded families (SLURM_, CUDA_, NCCL_, PYTORCH_, TORCH_) are written
  verbatim only when they are on ALLOWED, a list of settings known to hold no secret; any
  other variable of those families is recorded as present, its value redacted (Slurm's
  SLURM_JWT, NCCL_IB_PASSWD, a site's SLURM_DB_PASS and whatever comes next).
- Values that look like credentials (token=..., key: ..., password=..., "api_key": "...",
  a URL's password or a token as its user, an Authorization header, a JWT, a well-known
  token format, a .netrc's password, an Azure SAS signature, a private key block) are
  redacted wherever they appear, allowed names included
  (SLURM_JOB_COMMENT may carry "token=..."). A value after `NAME: ` or `NAME = ` (YAML,
  INI) runs to the end of its line, so a password with spaces is redacted whole.
- Command lines keep their shape, with the value of every option whose name looks secret
  (--wandb-key X, --api-token=X, --password X) masked, and the few short options that
  take a password in known programs (mysql -pX, sshpass -p X, curl -u user:X), the key
  of `wandb login KEY`, the value of a secret setting given to a `config`/`configure`
  command (aws configure set aws_secret_access_key X, git config user.password X), and
  the whole value of a word NAME=VALUE with a secret NAME (env 'PASSWORD=a b c', a Hydra
  override db.password=...); a word holding a command line (bash -c BODY) is masked the
  same way inside.

Names are judged by words, not by substrings (is_secret_name): --key-frames, --monkey,
--author, SESSION_NAME and --max-keys are not secrets; WANDB_API_KEY, PGPASSWORD,
GITHUB_PAT, SESSION_TOKEN are.

"""
