"""What the command modules share: the help layout, the sub-command parsers' type, and the
handler that makes a signal end a command as Ctrl-C does."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from train.common.fields import FlagParser

    # what `add_subparsers` returns: each sub-command's parser is a FlagParser
    Subparsers: TypeAlias = argparse._SubParsersAction[FlagParser]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """`-A, --account ACCOUNT` (the value named once), help from column 32."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings or action.nargs == 0:
            return super()._format_action_invocation(action)
        value = self._format_args(action, self._get_default_metavar_for_optional(action))
        return f"{', '.join(action.option_strings)} {value}"


def interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
