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

from __future__ import annotations

import base64
import binascii
import functools
import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence

REDACTED = "<redacted>"
FAMILIES = ("SLURM_", "SLURMD_", "CUDA_", "NCCL_", "PYTORCH_", "TORCH_")
ALLOWED = frozenset({
    # Slurm's job geometry and bookkeeping (sbatch/srun output environment)
    "SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NAME", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
    "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_NTASKS", "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_CPUS_PER_TASK",
    "SLURM_CPUS_ON_NODE", "SLURM_JOB_CPUS_PER_NODE", "SLURM_GPUS", "SLURM_GPUS_ON_NODE",
    "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK", "SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU",
    "SLURM_MEM_PER_GPU", "SLURM_JOB_PARTITION", "SLURM_JOB_ACCOUNT", "SLURM_JOB_QOS",
    "SLURM_JOB_RESERVATION", "SLURM_CLUSTER_NAME", "SLURM_SUBMIT_DIR", "SLURM_SUBMIT_HOST",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_ID", "SLURM_STEPID",
    "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES", "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_TASKS_PER_NODE", "SLURM_RESTART_COUNT", "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN",
    "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_STEP", "SLURM_JOB_GPUS", "SLURM_TOPOLOGY_ADDR",
    "SLURM_TOPOLOGY_ADDR_PATTERN", "SLURM_DISTRIBUTION", "SLURM_CPU_BIND", "SLURM_OPEN_MODE",
    "SLURM_PRIO_PROCESS", "SLURM_TASK_PID", "SLURM_CONF", "SLURM_JOB_START_TIME",
    "SLURM_JOB_END_TIME", "SLURM_JOB_USER", "SLURM_JOB_UID", "SLURM_JOB_GID",
    "SLURM_GTIDS", "SLURM_UMASK", "SLURM_EXPORT_ENV", "SLURMD_NODENAME",
    # CUDA and its device selection
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_HOME", "CUDA_PATH", "CUDA_VERSION",
    "CUDA_LAUNCH_BLOCKING", "CUDA_MODULE_LOADING", "CUDA_CACHE_PATH",
    "CUDA_DEVICE_MAX_CONNECTIONS",
    # NCCL's documented tuning knobs (no credentials among them)
    "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE", "NCCL_SOCKET_IFNAME",
    "NCCL_SOCKET_FAMILY", "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_IB_DISABLE",
    "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_IB_TIMEOUT", "NCCL_IB_RETRY_CNT",
    "NCCL_IB_SL", "NCCL_IB_TC", "NCCL_IB_CUDA_SUPPORT", "NCCL_NET", "NCCL_NET_GDR_LEVEL",
    "NCCL_NET_GDR_READ", "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE",
    "NCCL_ALGO", "NCCL_PROTO", "NCCL_BUFFSIZE", "NCCL_CROSS_NIC", "NCCL_NVLS_ENABLE",
    "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_TOPO_FILE", "NCCL_LAUNCH_MODE",
    "NCCL_ASYNC_ERROR_HANDLING", "NCCL_BLOCKING_WAIT", "NCCL_TIMEOUT",
    # torch's own settings
    "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK",
    "PYTORCH_NO_CUDA_MEMORY_CACHING", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_BLOCKING_WAIT", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_DISTRIBUTED_DEBUG", "TORCH_CPP_LOG_LEVEL", "TORCH_SHOW_CPP_STACKTRACES",
    "TORCH_NCCL_ENABLE_MONITORING", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
})
# --- names -------------------------------------------------------------------------------
# A name is cut into words (at _, -, ., and camelCase: apiKey -> API KEY), then judged:
# - a word holding PASSWORD, PASSWD, PASSPHRASE or SECRET (PGPASSWORD, clientSecret) or one
#   of _STRONG_WORDS is a secret, whatever else the name says;
# - TOKEN, KEY(S), AUTH, PASS and SESSION also name other things (--key-frames,
#   --pad-token, --auth-type, --pass-through, SESSION_NAME): they count unless the name
#   describes the secret rather than holding it (a last word such as TYPE, NAME, SIZE,
#   FRAMES), counts it (MAX_, NUM_...), or the word next to them says what kind it is;
# - an option --no-X / --ask-X and a name ending in STDIN or PROMPT is a switch (no value).
_STRONG_PARTS = ("PASSWORD", "PASSWD", "PASSPHRASE", "SECRET")
_STRONG_WORDS = frozenset({
    "PWD", "JWT", "CREDENTIAL", "CREDENTIALS", "CREDS", "COOKIE", "COOKIES", "BEARER",
    "PAT", "PRIVATE", "SIGNATURE", "AUTHORIZATION", "PASSCODE", "APIKEY", "APIKEYS",
    "ACCESSKEY", "AUTHKEY", "PRIVATEKEY", "SIGNINGKEY", "MASTERKEY",
})
_AMBIGUOUS_WORDS = frozenset({"TOKEN", "KEY", "KEYS", "AUTH", "PASS", "SESSION"})
# PASS joined to what it opens (sshpass's SSHPASS, DBPASS); BYPASS, COMPASS, TWOPASS are not
_PASS_OWNERS = frozenset({"SSH", "SFTP", "FTP", "DB", "PG", "MYSQL", "REDIS", "LDAP", "SMTP",
                          "MAIL", "ROOT", "ADMIN", "USER", "VNC", "RCLONE"})
# a last word that makes the name a description of the secret, not the secret itself
_DESCRIPTIVE = frozenset({
    "TYPE", "TYPES", "KIND", "METHOD", "MODE", "ALGO", "ALGORITHM", "FORMAT", "SIZE", "BITS",
    "LEN", "LENGTH", "DIM", "COUNT", "LIMIT", "NAME", "NAMES", "FRAME", "FRAMES", "TIMEOUT",
    "ENABLE", "ENABLED", "DISABLE", "DISABLED", "REQUIRED", "URL", "URI", "HOST", "PORT",
    "ENDPOINT", "SERVER", "PROVIDER", "PLUGIN",
})
_COUNTING = frozenset({"MAX", "MIN", "NUM", "N", "TOTAL"})  # --max-keys, NUM_KEYS: counts
_SWITCH_FIRST = frozenset({"NO", "ASK"})  # --no-auth, --ask-pass: switches, no value
_SWITCH_LAST = frozenset({"STDIN", "PROMPT"})  # --password-stdin
# KEY after these is a lookup key, not a credential (--sort-key, PRIMARY_KEY, --rng-key)
_KEY_KINDS = frozenset({
    "SORT", "PRIMARY", "FOREIGN", "PUBLIC", "PUB", "HOT", "DICT", "CACHE", "PARTITION",
    "SHARD", "GROUP", "RNG", "PRNG", "ROUTING", "LOOKUP", "INDEX", "JOIN", "METRIC",
    "MONITOR", "LABEL", "TEXT", "IMAGE", "INPUT", "OUTPUT", "TARGET", "COLUMN", "FIELD",
})
# TOKEN after these is a tokenizer's special token (--pad-token, EOS_TOKEN_ID)
_TOKEN_KINDS = frozenset({
    "PAD", "EOS", "BOS", "UNK", "SEP", "CLS", "MASK", "START", "END", "STOP", "SPECIAL",
    "DECODER",
})
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]+")


def _name_words(name: str) -> list[str]:
    words = _NOT_ALNUM.split(_CAMEL.sub("_", name).upper())
    return [w.rstrip("0123456789") for w in words if w.rstrip("0123456789")]


def is_secret_name(name: str) -> bool:
    """True for names like WANDB_API_KEY, NCCL_IB_PASSWD, SLURM_JWT, --auth-token,
    PGPASSWORD, MYSQL_PWD, GITHUB_PAT, API_KEYS, SESSION_ID; False for names that only
    describe or count one (--key-frames, SESSION_NAME, --max-keys, --auth-type), for
    switches (--no-auth, --password-stdin) and for the shell's PWD (while pwd=, Pwd= in a
    connection string is a password)."""
    if len(name) > 200:  # not an option or variable anyone names: judged uncached
        return _judge_name(name)
    return _judge_name_cached(name)


def _judge_name(name: str) -> bool:
    words = _name_words(name)
    if (not words or name == "PWD" or words[-1] in _SWITCH_LAST
            or (name.startswith("-") and words[0] in _SWITCH_FIRST)):
        return False
    plain = words[0] in _COUNTING or words[-1] in _DESCRIPTIVE
    for i, word in enumerate(words):
        if (word in _STRONG_WORDS or any(part in word for part in _STRONG_PARTS)
                or (word.endswith("TOKEN") and word != "TOKEN")  # ACCESSTOKEN, GHTOKEN
                or (word.endswith("PASS") and word[:-4] in _PASS_OWNERS)):
            return True
        if word not in _AMBIGUOUS_WORDS or plain:
            continue
        before = words[i - 1] if i else ""
        after = words[i + 1] if i + 1 < len(words) else ""
        if ((word in ("KEY", "KEYS") and before in _KEY_KINDS)
                or (word == "TOKEN" and before in _TOKEN_KINDS)
                or (word == "PASS" and after)  # --pass-through, --pass-env
                or (word == "SESSION" and after not in ("", "ID", "IDS"))):  # SESSION_DIR
            continue
        return True
    return False


_judge_name_cached = functools.lru_cache(maxsize=4096)(_judge_name)


def masked_environment(environ: Mapping[str, str | None]) -> dict[str, str | None]:
    """Variables as given (None for unset), the value of a secret-looking name redacted
    and credential-looking parts of the others redacted: for any variable outside the
    families of recorded_environment, e.g. a run's PYTHONPATH and CONDA_PREFIX."""
    return {name: None if value is None else REDACTED if is_secret_name(name)
            else redact_text(value) for name, value in environ.items()}


# --- values in text ----------------------------------------------------------------------
# Every pattern is linear: no quantified group holds a quantifier, a run that must be
# followed by something is started only where the run starts (a look-behind), and the
# character classes around each quantifier are disjoint, so a failed match gives up after
# one pass over the run.
#   NAME=VALUE, NAME: VALUE, "NAME": "VALUE", env['NAME'] = 'VALUE' (the value kept or
#   redacted by is_secret_name(NAME))
_PAIR = re.compile(r"(?<![\w.-])([\w.-]+)([\"']?\]?[ \t]*[=:][ \t]*)")
_BARE_VALUE = re.compile(r"[^\s,;&\"'<>(){}\[\]]+")
#   after `NAME: ` or `NAME = ` an unquoted value runs to the end of its line (YAML, INI)
_LINE_VALUE = re.compile(r"[^\n,;&\"'<>(){}\[\]]+")
_DQ_BODY = re.compile(r"(?:[^\"\\\n]|\\.)*")
_SQ_BODY = re.compile(r"[^'\n]*")
_SPACES = re.compile(r"[ \t]+")
_AUTH_SCHEMES = frozenset({"basic", "bearer", "digest", "token", "negotiate", "ntlm",
                           "apikey", "hmac", "aws4-hmac-sha256", "sso-key"})
#   scheme://user:password@host (the user kept)
_USERINFO = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@\"'<>]*:)"
                       r"([^\s/?#\"'<>]*)@")
#   scheme://TOKEN@host: a user name that is a token (32 or more letters, digits, - and _,
#   with letters and digits both): a GitHub or Azure DevOps token given as the user
_TOKEN_USER = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*://)([\w-]{32,})@")
_BEARER = re.compile(r"(?i)(?<![\w-])(bearer[ \t]+)[\w.~+/=-]{8,}")
_BASIC = re.compile(r"(?i)(?<![\w-])(basic[ \t]+)([A-Za-z0-9+/_-]{8,}={0,2})")
_JWT = re.compile(r"(?<![\w-])eyJ[\w-]{6,}\.[\w-]{6,}\.[\w-]*")
# well-known token formats: GitHub, GitLab, Hugging Face, Slack, OpenAI-style, AWS, Google
_KNOWN_TOKEN = re.compile(
    r"(?<![\w-])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{30,}|glpat-[\w-]{20,}"
    r"|hf_[A-Za-z0-9]{30,}|xox[abpors]-[\w-]{10,}|sk-[\w-]{32,}|AKIA[0-9A-Z]{16}"
    r"|AIza[\w-]{35})")


def _value_span(text: str, pos: int, header: bool, spaced: bool) -> tuple[int, int]:
    """Where the value that starts at `pos` lies (empty when there is none); `spaced`:
    after `: ` or ` = `, where an unquoted value runs to the end of the line."""
    if pos >= len(text) or text[pos] == "=":  # nothing, or `==`
        return pos, pos
    if text[pos] in "\"'":
        body = (_DQ_BODY if text[pos] == '"' else _SQ_BODY).match(text, pos + 1)
        return pos + 1, body.end() if body else pos + 1
    bare = _BARE_VALUE.match(text, pos)
    if not bare:
        return pos, pos
    if header and bare.group().lower() in _AUTH_SCHEMES:  # Authorization: Basic <this>
        gap = _SPACES.match(text, bare.end())
        if gap:
            rest = _BARE_VALUE.match(text, gap.end())
            if rest:
                return rest.span()
        return pos, pos
    if spaced:
        line = _LINE_VALUE.match(text, pos)
        assert line is not None  # it holds the bare value at least
        return pos, pos + len(line.group().rstrip())
    return bare.span()


def _redact_pairs(text: str) -> str:
    out: list[str] = []
    last = 0
    for match in _PAIR.finditer(text):
        if match.start() < last or not is_secret_name(match.group(1)):
            continue
        header = _name_words(match.group(1))[-1:] == ["AUTHORIZATION"]
        sep = match.group(2)
        spaced = ":" in sep or sep[:1].isspace() or sep[-1:].isspace()
        start, end = _value_span(text, match.end(), header, spaced)
        if end > start and text[start:end] != REDACTED:
            out += [text[last:start], REDACTED]
            last = end
    out.append(text[last:])
    return "".join(out)


def _basic(match: re.Match[str]) -> str:
    """`Basic <base64 of user:password>`: redacted when it decodes to a user:password."""
    code = match.group(2).replace("-", "+").replace("_", "/").rstrip("=")
    try:
        decoded = base64.b64decode(code + "=" * (-len(code) % 4), validate=True)
    except (binascii.Error, ValueError):
        return match.group()
    return match.group(1) + REDACTED if b":" in decoded else match.group()


def _known_token(match: re.Match[str]) -> str:
    token = match.group()
    if token.startswith("sk-") and not any(c.isdigit() for c in token):
        return token  # sk-a-long-slug-of-words: not a key
    return REDACTED


def _userinfo(match: re.Match[str]) -> str:
    if match.group(2) in ("", REDACTED):
        return match.group()
    return f"{match.group(1)}{REDACTED}@"


def _token_user(match: re.Match[str]) -> str:
    user = match.group(2)
    if any(c.isdigit() for c in user) and any(c.isalpha() for c in user):
        return f"{match.group(1)}{REDACTED}@"
    return match.group()


#   shapes with no NAME=VALUE: a .netrc's password (after `machine HOST` or `login USER`,
#   or before `login`), an Azure SAS URL's signature (sig=), a private key block's body
_NETRC = re.compile(r"(?<![\w-])((?:machine|login|default)[ \t\n]+(?:[^\s]+[ \t\n]+)?"
                    r"password[ \t\n]+)([^\s]+)")
_SAS_SIG = re.compile(r"([?&]sig=)([^&\s\"'#<>]+)")
_PRIVATE_KEY = re.compile(r"(-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----[ \t]*\n?)[^-]+")


def _netrc(match: re.Match[str]) -> str:
    return match.group() if match.group(2) == REDACTED else match.group(1) + REDACTED


def _redact_values(text: str) -> str:
    text = _PRIVATE_KEY.sub(lambda m: f"{m.group(1)}{REDACTED}\n", text)
    text = _NETRC.sub(_netrc, text)
    text = _SAS_SIG.sub(lambda m: m.group(1) + REDACTED, text)
    text = _USERINFO.sub(_userinfo, text)
    text = _TOKEN_USER.sub(_token_user, text)
    text = _redact_pairs(text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    text = _BASIC.sub(_basic, text)
    text = _JWT.sub(REDACTED, text)
    return _KNOWN_TOKEN.sub(_known_token, text)


# --- command lines -----------------------------------------------------------------------
# Beyond options with secret-looking names, a few programs take a password in a short
# option: only within such a program's command (its name seen, up to the next ;, &&, |
# or line) is the option read so, since -p and -a mean other things elsewhere (a port, an
# address). mysql's -p takes the password attached only (-pSECRET; `-p db` prompts).
_TOOLS: dict[str, tuple[frozenset[str], frozenset[str]]] = {  # separate, attached
    **dict.fromkeys(("mysql", "mysqldump", "mysqladmin", "mysqlimport", "mysqlshow",
                     "mysqlcheck", "mysqlpump", "mysqlslap", "mariadb", "mariadb-dump",
                     "mariadb-admin", "mariadb-import", "mariadb-check", "mariadb-show"),
                    (frozenset(), frozenset({"-p"}))),
    "sshpass": (frozenset({"-p"}), frozenset({"-p"})),
    "redis-cli": (frozenset({"-a"}), frozenset()),
    **dict.fromkeys(("mongo", "mongosh", "mongodump", "mongorestore", "mongoexport",
                     "mongoimport", "mongostat", "mongotop"),
                    (frozenset({"-p"}), frozenset())),
    "openssl": (frozenset({"-passin", "-passout", "-k"}), frozenset()),
    "login": (frozenset({"-p"}), frozenset()),  # docker/podman/helm ... login -p X
    "curl": (frozenset(), frozenset()),  # -u/--user user:password, below
}
_LOGIN_TOOLS = frozenset({"docker", "podman", "buildah", "skopeo", "nerdctl", "helm",
                          "oras", "crane", "regctl"})
_CURL_USER = frozenset({"-u", "--user", "-U", "--proxy-user"})
# `wandb login [OPTIONS] [KEY]`: the first word that is not an option or --host's value
_WANDB_LOGIN_VALUED = frozenset({"--host"})
# `aws configure set NAME VALUE`, `git config NAME VALUE`, `npm config set NAME VALUE`: in a
# command with one of these words, the word after a secret-looking NAME is its value
_CONFIG_WORDS = frozenset({"config", "configure"})
# a word NAME=VALUE (env's and the shell's assignments, Hydra's overrides): all of VALUE,
# unless the word is a command line (quoted or escaped, or after bash's -c): then each of
# its words is judged (PASSWORD='a b c' fit.py keeps fit.py)
_ASSIGNED_NAME = re.compile(r"[A-Za-z_][\w.-]*")
_BODY_OPTION = re.compile(r"-[a-z]{0,3}c")
_SEPARATORS = frozenset({";", "&", "&&", "|", "||", "|&"})
_NO_TOOL: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())


def _is_option(word: str) -> bool:
    """A long option (or the `--` that ends them): not taken as a masked option's value,
    so a switch whose name looks secret (--private, --hub-token-stdin) does not hide the
    option after it."""
    return word == "--" or (word[:2] == "--" and word[2:3].isalpha())


def _after_colon(word: str, start: int) -> int | None:
    colon = word.find(":", start)
    return None if colon < 0 else colon + 1


def _mask_points(words: Sequence[str | None]) -> list[int | None]:
    """For each word (None for a command separator): None to keep it, or how many of its
    first characters to keep, the rest masked (0: all of it)."""
    points: list[int | None] = []
    tool = ""
    config = False  # a `config`/`configure` command
    # "value": mask the next word; "user": the password of the next user:pw; "keep": the
    # next word is an option's value, kept
    pending = ""
    previous: str | None = None
    for word in words:
        prior, previous = previous, word
        if word is None:
            tool = pending = ""
            config = False
            points.append(None)
            continue
        point: int | None = None
        if pending and not _is_option(word):
            if pending != "keep":
                point = 0 if pending == "value" else _after_colon(word, 0)
            pending = ""
            points.append(point)
            continue
        pending = ""
        base = os.path.basename(word)
        if tool == "wandb login" and word[:1] != "-":  # the key
            tool = "wandb"
            points.append(0)
            continue
        if word == "login" and tool == "wandb":
            tool = "wandb login"
        elif base in _TOOLS:
            tool = base
        elif word == "login" and tool in _LOGIN_TOOLS:
            tool = "login"
        elif base in _LOGIN_TOOLS or base == "wandb":
            tool = base
        config = config or word in _CONFIG_WORDS
        name, sep, _ = word.partition("=")
        if word[:1] != "-" and sep and _ASSIGNED_NAME.fullmatch(name) \
                and is_secret_name(name) and not any(c in word for c in "'\"\\") \
                and not (prior and _BODY_OPTION.fullmatch(prior)):  # env 'PASSWORD=a b'
            point = len(name) + 1
        elif config and word[:1] != "-" and not sep and is_secret_name(word):
            pending = "value"  # aws configure set aws_secret_access_key VALUE
        elif tool == "wandb login" and word in _WANDB_LOGIN_VALUED:
            pending = "keep"
        elif word[:1] == "-" and len(word) > 1 and not word.startswith("--="):
            separate, attached = _TOOLS.get(tool, _NO_TOOL)
            # the program's own password options first: -psecret is mysql's -p with the
            # password "secret", not an option named like a secret (whose value follows)
            if word in separate:
                pending = "value"
            elif word[:2] in attached and len(word) > 2 and word[1] != "-":  # -pSECRET
                point = 2
            elif is_secret_name(name):
                if sep:
                    point = len(name) + 1
                else:
                    pending = "value"
            elif tool == "curl" and name in _CURL_USER:
                if sep:
                    point = _after_colon(word, len(name) + 1)
                else:
                    pending = "user"
            elif tool == "curl" and word.startswith("-u"):  # -uuser:password
                point = _after_colon(word, 2)
        points.append(point)
    return points


_PLAIN = re.compile(r"[^\s'\"\\;&|()]+")
_DQ_PLAIN = re.compile(r"[^\"\\]+")
_GAP = re.compile(r"\s+")
_OPERATOR = re.compile(r"[;&|()]+")
_MAX_DEPTH = 3  # bash -c "ssh host 'sh -c \"...\"'" and no deeper


def _shell_words(text: str) -> list[tuple[int, int, str | None]]:
    """The words of a shell command line, as (start, end, value without quotes), with
    (start, end, None) for an operator or a new line. A quote left open runs to the end.
    One pass: every step moves on by at least one character."""
    words: list[tuple[int, int, str | None]] = []
    i, n = 0, len(text)
    while i < n:
        gap = _GAP.match(text, i)
        if gap:
            if "\n" in gap.group():
                words.append((i, gap.end(), None))
            i = gap.end()
            continue
        operator = _OPERATOR.match(text, i)
        if operator:
            words.append((i, operator.end(), None))
            i = operator.end()
            continue
        start, parts = i, []
        while i < n:
            char = text[i]
            if char == "'":
                close = text.find("'", i + 1)
                close = n if close < 0 else close
                parts.append(text[i + 1:close])
                i = close + 1
            elif char == '"':
                i += 1
                while i < n and text[i] != '"':
                    if text[i] == "\\":
                        parts.append(text[i + 1:i + 2])
                        i += 2
                    else:
                        plain = _DQ_PLAIN.match(text, i)
                        assert plain is not None  # text[i] is neither '"' nor '\\'
                        parts.append(plain.group())
                        i = plain.end()
                i += 1
            elif char == "\\":
                parts.append(text[i + 1:i + 2])
                i += 2
            else:
                plain = _PLAIN.match(text, i)
                if not plain:  # a space or an operator ends the word
                    break
                parts.append(plain.group())
                i = plain.end()
        i = min(i, n)
        words.append((start, i, "".join(parts)))
    return words


def _masked_word(raw: str, value: str, point: int) -> str:
    """`raw` (as written, quotes and all) with `value`[point:] masked."""
    keep = value[:point]
    if raw.startswith(keep):
        return keep + REDACTED
    if len(raw) > 1 and raw[0] == raw[-1] and raw[0] in "'\"" and raw[1:-1] == value:
        return raw[0] + keep + REDACTED + raw[0]
    return (shlex.quote(keep) if keep else "") + REDACTED


def _mask_shell(text: str, depth: int = 0) -> str:
    """A shell command line (`bash -c BODY`'s body, `ssh host CMD`) with the same masking
    as masked_argv, in quoted words too (`bash -c "... 'sh -c \"--token x\"'"`)."""
    spans = _shell_words(text)
    points = _mask_points([value for _, _, value in spans])
    out: list[str] = []
    last = 0
    for (start, end, value), point in zip(spans, points, strict=True):
        if value is None:
            continue
        raw = text[start:end]
        if point is not None:
            new = _masked_word(raw, value, point)
        elif depth < _MAX_DEPTH and value != raw and any(c.isspace() for c in value):
            inner = _mask_shell(value, depth + 1)
            if inner == value:
                continue
            if len(raw) > 1 and raw[0] == raw[-1] and raw[0] in "'\"" and raw[1:-1] == value:
                new = raw[0] + inner + raw[0]
            else:
                new = shlex.quote(inner)
        else:
            continue
        out += [text[last:start], new]
        last = end
    out.append(text[last:])
    return "".join(out)


def redact_text(text: str) -> str:
    """`text` with every credential-looking part replaced by <redacted>: values of
    secret-looking names (token=..., "api_key": "...", --token X, --password='X'),
    the password of a URL (scheme://user:<redacted>@host), Authorization headers (Basic,
    Bearer ...), JWTs and well-known token formats (ghp_..., hf_..., AKIA...), and the
    passwords of the command lines in it (mysql -p..., curl -u user:..., sshpass -p ...)."""
    return _redact_values(_mask_shell(text))


def recorded_environment(environ: Mapping[str, str],
                         families: tuple[str, ...] = FAMILIES) -> dict[str, str]:
    """The variables of `families`: allowed ones verbatim (credential-looking parts of
    their values redacted), every other one present but redacted."""
    out = {}
    for name in sorted(environ):
        if not name.startswith(families):
            continue
        if name in ALLOWED and not is_secret_name(name):
            out[name] = redact_text(environ[name])
        else:
            out[name] = REDACTED
    return out


def masked_argv(argv: Iterable[str]) -> list[str]:
    """argv with the values of secret-looking options masked: `--wandb-key X` and
    `--wandb-key=X` both keep the option and lose the value, as do the passwords of a few
    programs' short options (mysql -pX, sshpass -p X, curl -u user:X); every other word
    goes through redact_text, so the body of `bash -c BODY` is masked the same way."""
    words = list(argv)
    points = _mask_points([None if word in _SEPARATORS else word for word in words])
    return [redact_text(word) if point is None else word[:point] + REDACTED
            for word, point in zip(words, points, strict=True)]
