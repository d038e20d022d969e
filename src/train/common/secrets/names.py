"""Which names hold a secret (is_secret_name), judged by words, not by substrings; and
REDACTED, what a secret is replaced with everywhere."""

from __future__ import annotations

import functools
import re

REDACTED = "<redacted>"

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
