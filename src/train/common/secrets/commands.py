"""Command lines with their secrets masked (masked_argv), and any text with them and its
credential-looking values masked (redact_text): values of secret-looking names, a URL's
password, Authorization headers, JWTs, well-known token formats, a .netrc's password, an
Azure SAS signature and a private key block's body."""

from __future__ import annotations

import base64
import binascii
import os
import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from train.common.secrets.names import REDACTED, _name_words, is_secret_name

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


def _redact_values(text: str) -> str:
    text = _PRIVATE_KEY.sub(lambda m: f"{m.group(1)}{REDACTED}\n", text)
    text = _NETRC.sub(lambda m: m.group() if m.group(2) == REDACTED
                      else m.group(1) + REDACTED, text)
    text = _SAS_SIG.sub(lambda m: m.group(1) + REDACTED, text)
    text = _USERINFO.sub(lambda m: m.group() if m.group(2) in ("", REDACTED)
                         else f"{m.group(1)}{REDACTED}@", text)
    text = _TOKEN_USER.sub(_token_user, text)
    text = _redact_pairs(text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    text = _BASIC.sub(_basic, text)
    text = _JWT.sub(REDACTED, text)
    return _KNOWN_TOKEN.sub(_known_token, text)


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
    command = _Command()
    prior: str | None = None
    for word in words:
        if word is None:  # a separator starts a new command
            command = _Command()
            points.append(None)
        else:
            points.append(command.point(word, prior))
        prior = word
    return points


@dataclass
class _Command:
    """What is known of the command being read, word by word: its program (`tool`),
    whether it is a `config`/`configure` command, and what the next word is (`pending`:
    "value" to mask it, "user" for the password of a user:pw, "keep" for an option's
    value that is kept)."""

    tool: str = ""
    config: bool = False
    pending: str = ""

    def point(self, word: str, prior: str | None) -> int | None:
        """How much of `word` to keep (None: all); `prior`: the word before it."""
        if self.pending and not _is_option(word):
            pending, self.pending = self.pending, ""
            if pending == "keep":
                return None
            return 0 if pending == "value" else _after_colon(word, 0)
        self.pending = ""
        if self.tool == "wandb login" and word[:1] != "-":  # the key
            self.tool = "wandb"
            return 0
        self.tool = _next_tool(self.tool, word)
        self.config = self.config or word in _CONFIG_WORDS
        point, self.pending = self._judge(word, prior)
        return point

    def _judge(self, word: str, prior: str | None) -> tuple[int | None, str]:
        """A word that is not a pending value: (how much of it to keep, what the next
        word is)."""
        name, sep, _ = word.partition("=")
        if word[:1] != "-" and sep and _ASSIGNED_NAME.fullmatch(name) \
                and is_secret_name(name) and not any(c in word for c in "'\"\\") \
                and not (prior and _BODY_OPTION.fullmatch(prior)):  # env 'PASSWORD=a b'
            return len(name) + 1, ""
        if self.config and word[:1] != "-" and not sep and is_secret_name(word):
            return None, "value"  # aws configure set aws_secret_access_key VALUE
        if self.tool == "wandb login" and word in _WANDB_LOGIN_VALUED:
            return None, "keep"
        if word[:1] == "-" and len(word) > 1 and not word.startswith("--="):
            return _option_point(word, name, sep, self.tool)
        return None, ""


def _next_tool(tool: str, word: str) -> str:
    """The program whose options are being read, after `word`."""
    base = os.path.basename(word)
    if word == "login" and tool == "wandb":
        return "wandb login"
    if base in _TOOLS:
        return base
    if word == "login" and tool in _LOGIN_TOOLS:
        return "login"
    if base in _LOGIN_TOOLS or base == "wandb":
        return base
    return tool


def _option_point(word: str, name: str, sep: str, tool: str) -> tuple[int | None, str]:
    """An option (`name`, with `sep` "=" where its value is attached): how much of it to
    keep, and what the next word is. The program's own password options first: -psecret
    is mysql's -p with the password "secret", not an option named like a secret (whose
    value follows)."""
    separate, attached = _TOOLS.get(tool, _NO_TOOL)
    if word in separate:
        return None, "value"
    if word[:2] in attached and len(word) > 2 and word[1] != "-":  # -pSECRET
        return 2, ""
    if is_secret_name(name):
        return (len(name) + 1, "") if sep else (None, "value")
    if tool == "curl" and name in _CURL_USER:
        return (_after_colon(word, len(name) + 1), "") if sep else (None, "user")
    if tool == "curl" and word.startswith("-u"):  # -uuser:password
        return _after_colon(word, 2), ""
    return None, ""


_PLAIN = re.compile(r"[^\s'\"\\;&|()]+")
# a quoted word (a quote left open runs to the end), and the escapes in a double-quoted one
_QUOTED = {"'": re.compile(r"'([^']*)'?"),
           '"': re.compile(r'"((?:[^"\\]|\\.|\\\Z)*)"?', re.S)}
_ESCAPED = re.compile(r"\\(.?)", re.S)
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
            if char in "'\"":
                quoted = _QUOTED[char].match(text, i)
                assert quoted is not None  # (each matches at its quote)
                body = quoted.group(1)
                parts.append(_ESCAPED.sub(r"\1", body) if char == '"' else body)
                i = quoted.end()
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
    # (no strict=, 3.10+: the bound launcher runs this in an image's Python from 3.9)
    for (start, end, value), point in zip(spans, points):  # noqa: B905  # one per word
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
    """`text` with every credential-looking part (_redact_values) and the secrets of the
    command lines in it (masked_argv's) replaced by <redacted>."""
    return _redact_values(_mask_shell(text))


def masked_argv(argv: Iterable[str]) -> list[str]:
    """argv with the values of secret-looking options masked: `--wandb-key X` and
    `--wandb-key=X` both keep the option and lose the value, as do the passwords of a few
    programs' short options (mysql -pX, sshpass -p X, curl -u user:X); every other word
    goes through redact_text, so the body of `bash -c BODY` is masked the same way."""
    words = list(argv)
    points = _mask_points([None if word in _SEPARATORS else word for word in words])
    return [redact_text(word) if point is None else word[:point] + REDACTED
            for word, point in zip(words, points)]  # noqa: B905  # (as above: 3.9)
