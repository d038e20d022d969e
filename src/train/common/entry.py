"""How the job's own commands start this package on a node, whatever the folder holds.

`python -m train` puts the current folder first on `sys.path`, so a `train.py` in the submit
folder (common in research code) would be imported instead of this package; `python -P`
needs Python 3.11. So the step runs `python -c ENTRY ARGS` (valid Python from 3.6): ENTRY
takes the current folder off `sys.path`, then runs the module as `python -m` would.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from train.common.errors import EXIT_RESOURCE

_CLEAN_PATH = ("here = os.path.realpath(os.getcwd()); "
               "sys.path[:] = [p for p in sys.path if p and os.path.realpath(p) != here]; ")
_RUN = "runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"


def entry_code(module: str = "train") -> str:
    return ("import os, sys, runpy; " + _CLEAN_PATH + _RUN).format(module=module)


def module_argv(python: str, module: str = "train") -> list[str]:
    """`python -m MODULE` as a job runs it: never from the current folder."""
    return [python, "-c", entry_code(module)]


def tool_args(command: Sequence[str]) -> list[str] | None:
    """The arguments of this package's command line in `command` (`python -c ENTRY ARGS`,
    or `python -m train ARGS` as a user may write it), or None for another program."""
    argv = list(command)
    for i in range(len(argv) - 1):
        if (argv[i], argv[i + 1]) in (("-c", entry_code()), ("-m", "train")):
            return argv[i + 2:]
    return None


# An image without `train` ("bring your own image", train.node.nodeentry): the client binds
# its own package read-only at LAUNCHER_ROOT/train and the step runs the image's Python
# with the entry below: the version check first (too old: one line, exit 3), then
# LAUNCHER_ROOT at the END of that process's sys.path only (the image's packages win;
# nothing in PYTHONPATH: the program keeps the image's environment), then the module.
MIN_PYTHON = (3, 9)
LAUNCHER_ROOT = "/opt/train-launcher"
BOUND_MODULE = "train.node.nodeentry"
# checked with the image's Python before anything of ours is imported: valid Python 3 of
# any version, and it says the version it found in one line
BOUND_TEMPLATE = (
    "import sys; sys.version_info[:2] >= {minimum!r} or sys.exit((sys.stderr.write("
    "'train: error: this image\\'s Python is %d.%d (%s); the job\\'s launcher needs Python "
    ">= {shown}: use an image with a newer Python, or name its interpreter with --python"
    "\\n' % (sys.version_info[0], sys.version_info[1], sys.executable)), {code})[1]); "
    "import os, runpy; " + _CLEAN_PATH + "sys.path.append({root!r}); " + _RUN)


def bound_entry_code(module: str = BOUND_MODULE, root: str = LAUNCHER_ROOT) -> str:
    """The image's Python checks its version, then runs `module` from the bound copy."""
    shown = ".".join(map(str, MIN_PYTHON))
    return BOUND_TEMPLATE.format(minimum=MIN_PYTHON, shown=shown, code=EXIT_RESOURCE,
                                 root=root, module=module)


def bound_entry_argv(python: str, module: str = BOUND_MODULE) -> list[str]:
    """The image's Python running `module` from the bound package."""
    return [python, "-c", bound_entry_code(module)]


def bound_root() -> str | None:
    """LAUNCHER_ROOT where this package was loaded from there (the bound copy), else
    None: a process this one starts with our code (the GPU watch) needs it on its path."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return here if here == LAUNCHER_ROOT else None
