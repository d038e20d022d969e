"""`python -m train.cli` runs the command-line interface, as `python -m train` does."""

from train.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
