"""The chain engine's entry, and its copy in the run folder.

`train submit` copies this package's engine modules into RUN_DIR/.train (`install`), so
a chain keeps running the engine it was submitted with: upgrading, moving or removing
the client while its chunks wait in the queue changes nothing for them. The job script
runs it with the batch host's python3 (`python3 -E -s RUN_DIR/.train chunk ...`; each
task `... task -- COMMAND`): standard library only, valid Python 3.6 (EL8's python3),
checked at submit where the login node can (train.client.slurm.checks.python).
"""

import os
import shutil
import sys
from typing import List, Sequence, Tuple

# the modules copied, in this package (the engine imports nothing else of train)
MODULES = ("__init__.py", "contract.py", "saves.py", "step.py", "chunk.py", "task.py",
           "engine.py")
ENGINE_DIR = ".train"  # in the run folder
MIN_PYTHON = (3, 6)
MAIN = ("import sys\n"
        "from train.batch.engine import main\n"
        "sys.exit(main(sys.argv[1:]))\n")
USAGE = ("usage: ENGINE chunk SCRIPT [CHUNK [FIRST]] -- STEP... | ENGINE task -- COMMAND... "
         "| ENGINE clean RUNTIME LABEL TAG")


def main(argv: Sequence[str]) -> int:
    if sys.version_info[:2] < MIN_PYTHON:
        sys.stderr.write("train-job: the chain engine needs Python >= 3.6; this python3 is "
                         "{}.{}\n".format(*sys.version_info[:2]))
        return 3
    mode, rest = (argv[0], list(argv[1:])) if argv else ("", [])
    if mode == "chunk":
        from train.batch import chunk

        return chunk.main(rest)
    if mode == "task" and rest[:1] == ["--"] and rest[1:]:
        from train.batch import task

        return task.run(rest[1:])
    if mode == "clean" and len(rest) == 3:
        from train.batch import task

        return task.clean(*rest)
    sys.stderr.write("train-job: " + USAGE + "\n")
    return 2


def install(run_dir: str) -> str:
    """The engine copied into RUN_DIR/.train (replacing an earlier chain's copy whole):
    the folder the job script runs."""
    here = os.path.dirname(os.path.abspath(__file__))
    target = os.path.join(run_dir, ENGINE_DIR)
    fresh = target + ".new-{}".format(os.getpid())
    shutil.rmtree(fresh, ignore_errors=True)
    package = os.path.join(fresh, "train", "batch")
    os.makedirs(package)
    for name in MODULES:
        shutil.copyfile(os.path.join(here, name), os.path.join(package, name))
    files: List[Tuple[str, str]] = [(os.path.join(fresh, "train", "__init__.py"),
                           '"""The chain engine\'s copy (train.batch.engine.install)."""\n'),
                          (os.path.join(fresh, "__main__.py"), MAIN)]
    for path, text in files:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    old = target + ".old-{}".format(os.getpid())
    if os.path.lexists(target):
        os.rename(target, old)
    os.rename(fresh, target)
    shutil.rmtree(old, ignore_errors=True)
    return target
