"""Credential-looking values in free text (_redact_values): values of secret-looking
names, a URL's password, Authorization headers, JWTs, well-known token formats, a .netrc's
password, an Azure SAS signature and a private key block's body."""

from __future__ import annotations

import base64
import binascii
import re

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
