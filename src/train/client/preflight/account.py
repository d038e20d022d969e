"""Preflight, check 3: the account is one of the user's (the site's own command from the
profile, else sacctmgr)."""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Mapping

from train.client.clusters.schema import Profile
from train.client.preflight.result import ACCOUNT, Check, Runner, _run, _tail, which

_ACCOUNTS_TIMEOUT = 60.0
_ACCOUNT_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,127}")


def _user(environ: Mapping[str, str]) -> str | None:
    name = environ.get("USER") or environ.get("LOGNAME")
    if name:
        return name
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return None


def _first_fields(text: str) -> list[str]:
    """The first field of every line, lower-cased (fields separated by whitespace or '|')."""
    out = []
    for line in text.lower().splitlines():
        fields = [f for f in re.split(r"[\s|]+", line) if f]
        if fields:
            out.append(fields[0])
    return out


def listed_accounts(text: str) -> set[str]:
    """The first field of every line (slist's and allocations' tables, sacctmgr -nP) and
    every whole line, lower-cased: a word elsewhere ("denied: acct is suspended") is none."""
    return {*_first_fields(text),
            *(line.strip() for line in text.lower().splitlines() if line.strip())}


def _output(argv: list[str], label: str, environ: Mapping[str, str], run: Runner,
            notes: list[str]) -> str | None:
    """What a command found on PATH prints; None where it is not there or fails (why is
    added to `notes`)."""
    binary = which(argv[0], environ)
    if binary is None:
        notes.append(f"{label} is not on PATH")
        return None
    code, out, err = _run(run, [binary, *argv[1:]], _ACCOUNTS_TIMEOUT)
    if code != 0:
        notes.append(f"{label} failed (exit {code}): {_tail(err or out, 1, 160)}")
        return None
    return out


def _check_account(profile: Profile, account: str | None, environ: Mapping[str, str],
                   run: Runner) -> Check:
    hint = f" ({profile.account_hint})" if profile.account_hint else ""
    if account is None:
        if profile.account_required:
            return Check(ACCOUNT, False, f"{profile.name} requires an account and none is "
                         f"given{hint}", "pass --account ACCOUNT, or set it once: train init "
                         "--account ACCOUNT")
        return Check(ACCOUNT, None, f"no account given ({profile.name} does not require one)")
    notes: list[str] = []
    command = profile.account_list_command
    label = f"`{' '.join(command)}`"
    listed = _output(list(command), label, environ, run, notes) if command else None
    if listed is not None and account.lower() in listed_accounts(listed):
        return Check(ACCOUNT, True, f"{account} is listed by {label}")
    not_listed = f"{label} does not list {account}" if listed is not None else None
    user = _user(environ)
    if user is None:
        notes.append("the user name is unknown (no USER)")
    elif (out := _output(["sacctmgr", "-nP", "show", "assoc", f"user={user}",
                          "format=account"], "sacctmgr", environ, run, notes)) is not None:
        accounts = sorted(set(_first_fields(out)))  # -nP: one account a line
        if not accounts:
            notes.append(f"sacctmgr lists no associations for {user}")
        elif account.lower() in accounts:
            also = f" ({not_listed})" if not_listed else ""
            return Check(ACCOUNT, True, f"{account} is one of {user}'s accounts in sacctmgr"
                         f"{also}")
        else:
            return Check(ACCOUNT, False, f"{account} is not one of {user}'s accounts; "
                         f"sacctmgr lists: {', '.join(accounts)}"
                         + (f"; {not_listed}" if not_listed else ""),
                         f"pass one of them with --account{hint}")
    if not_listed:
        return Check(ACCOUNT, False, f"{not_listed}" + (f" ({'; '.join(notes)})" if notes
                                                          else ""),
                     f"check the spelling and pass one of the accounts it lists with --account"
                     f"{hint}")
    if not command:
        notes.insert(0, f"{profile.name} records no command that lists accounts "
                     "(account.list_command)")
    return Check(ACCOUNT, None, f"cannot tell whether {account} is yours: "
                 f"{'; '.join(notes)}; sbatch will say at submission")
