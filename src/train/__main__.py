"""`python -m train` runs the command-line interface; the `train launch` of a job step
starts without the other commands' parsers (train.node.nodeentry.light_launch)."""

import sys

from train.node.nodeentry import light_launch

if __name__ == "__main__":
    code = light_launch(sys.argv[1:])
    if code is None:
        from train.cli import main

        code = main()
    raise SystemExit(code)
