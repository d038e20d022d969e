"""sbatch's own variables: SBATCH_*, SALLOC_* and SLURM_* of this environment are not
passed to sbatch (every chunk runs with exactly the job's options), each one that would
set an option said with the flag to give instead."""

from __future__ import annotations

import os
from collections.abc import Mapping

from train.client.slurm.jobitems import SBATCH_OWNED

# sbatch reads these too, as the options SBATCH_CLUSTERS and SBATCH_HINT
_SLURM_OPTION_VARS = ("SLURM_CLUSTERS", "SLURM_HINT")
# variable suffix -> sbatch option, where it is not the suffix in lower case with '-'
_VAR_OPTIONS = {"TIMELIMIT": "--time", "MEM_PER_NODE": "--mem", "ARRAY_INX": "--array",
                "DEBUG": "--verbose", "NO_KILL": "--no-kill"}


def sbatch_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for `train submit`'s sbatch: this one without SBATCH_* (they would
    override chunk 1's #SBATCH lines only), SALLOC_* or SLURM_* (an allocation's, when
    submitting from inside one) variables; SLURM_CONF stays. The chain's own sbatch
    (job-lib.sh's train_sbatch) drops the same, so chunk 1 and its successors are alike."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k == "SLURM_CONF"
            or not k.startswith(("SLURM_", "SBATCH_", "SALLOC_"))}


def sbatch_variable_notes(environ: Mapping[str, str]) -> list[str]:
    """A warning for each variable of the environment that would set an option of the job
    (SBATCH_*, and SLURM_CLUSTERS/SLURM_HINT), with the flag to give instead."""
    notes = []
    for name in sorted(environ):
        if not (name.startswith("SBATCH_") or name in _SLURM_OPTION_VARS):
            continue
        suffix = name.split("_", 1)[1]
        option = _VAR_OPTIONS.get(suffix, "--" + suffix.lower().replace("_", "-"))
        use = SBATCH_OWNED.get(option)
        if use is None:
            instead = f"give --sbatch-extra={option}=VALUE instead"
        elif "(" in use:  # "(why)", or "field (why)" for an option the field does not set
            why = use[1:-1] if use.startswith("(") else use
            instead = f"the job sets {option} itself: {why}"
        else:  # "field", or "field and field"
            flags = " and ".join("--" + f.replace("_", "-") for f in use.split(" and "))
            instead = f"give {flags} instead"
        notes.append(f"{name}={environ[name]} is not passed to sbatch: every chunk of the "
                     f"chain runs with the job's own options ({instead})")
    return notes
