"""How the job's own commands start this package on a node, whatever the folder holds.

`python -m train` puts the current folder first on `sys.path`: a `train.py` (or a `train/`
package) in the submit folder, the most common layout of research code, is imported
instead of this package and runs with the tool's arguments. `python -P` would avoid that,
but only from Python 3.11, and the image's or the node's Python may be older. So the job
step runs `python -c ENTRY ARGS`: ENTRY takes the current folder (the empty entry `-c`
puts there, and any entry naming the same folder) off `sys.path` and then runs the module
as `python -m` would. It is valid Python from 3.6 on. The program a job runs for the user
is not touched: its `sys.path` is its own.
"""

from __future__ import annotations

from collections.abc import Sequence

ENTRY_TEMPLATE = (
    "import os, sys, runpy; here = os.path.realpath(os.getcwd()); "
    "sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != here]; "
    "runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")


def entry_code(module: str = "train") -> str:
    return ENTRY_TEMPLATE.format(module=module)


def module_argv(python: str, module: str = "train") -> list[str]:
    """`python -m MODULE` as a job runs it: never from the current folder."""
    return [python, "-c", entry_code(module)]


def tool_args(command: Sequence[str]) -> list[str] | None:
    """The arguments of this package's command line in `command` (`python -c ENTRY ARGS`,
    or `python -m train ARGS` as a user may write it), or None for another program."""
    argv = list(command)
    for i in range(len(argv) - 1):
        if argv[i] == "-c" and argv[i + 1] == entry_code():
            return argv[i + 2:]
        if argv[i] == "-m" and argv[i + 1] == "train":
            return argv[i + 2:]
    return None
