"""What is recorded or logged of the environment and of command lines, without secrets.

Variables of the recorded families are written verbatim only when on ALLOWED (settings known
to hold no secret), the others redacted (environment); credential-looking values are
redacted wherever they appear, allowed names included, and command lines keep their shape
with every secret value masked, inside `bash -c BODY` too (commands). Names are
judged by words, not by substrings (names.is_secret_name): --key-frames, --monkey,
SESSION_NAME and --max-keys are not secrets; WANDB_API_KEY, PGPASSWORD, GITHUB_PAT are.
"""
