"""Preflight on the login node (`train doctor --preflight`): will a job of this profile start?

Five checks, each saying how to fix what fails: the container runtime is there (and new
enough), the image opens, the account is one of the user's (the site's own command from the
profile, else sacctmgr), the runs root is writable and on a file system the compute nodes
share, and the image's CUDA build suits the nodes' NVIDIA driver where the profile records it.
A check that cannot know says so (SKIP) and never fails on not knowing; a warning (WARN) is a
pass with a fix. Every outside command goes through `run` (default: `run_command`, which runs
it in a process group of its own and kills the whole group when it times out) with a
timeout, found on `environ`'s PATH; the mount table is read from `mounts`: tests inject all.
Bad input (an unknown runtime, partition or constraint, an unusable account name or path)
raises ConfigError naming the field; everything else is a check's result.

The checks live by family: container (1), image (2), account (3), storage and runs_root (4),
gpu (5 and 6); result holds Check and how checks are shown, commands how outside commands
run, suite the order (run_preflight). Import each name from the module that defines it.
"""
