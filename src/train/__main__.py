"""`python -m train` runs the command-line interface."""

from train.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
