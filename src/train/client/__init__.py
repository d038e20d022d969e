"""The login node: job specs and their resolution, render, submit, status, sweeps, the
submit checks, site profiles, doctor and preflight. Torch-free (tests/unit/test_layout.py)."""
