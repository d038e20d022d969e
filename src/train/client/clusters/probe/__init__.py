"""`train clusters probe NAME`: what the site's Slurm says, against what the profile says.

Run on the login node. Reads
- `sinfo -N` (one line a node and partition): each partition's nodes, their CPUs,
  memory, GRES (count and types) and features, the partition's time limit and job size,
  and which partition is the default (the `*` of %P). The `-o` format, not `--json`: its
  fields are the same from Slurm 22.05 to 25.x, where the JSON's layout is not;
- `scontrol show config`: the Slurm version, PreemptMode, KillWait, EnforcePartLimits, and
  MaxArraySize (the profile's max_array_size);
- `scontrol show reservation -o`: the maintenance reservations ahead (flag MAINT), shown,
  never written (each is dated);
- `sacctmgr show qos` (each QOS's MaxWall) and the user's associations (accounts,
  partitions, QOS), where the site's accounting answers;
- `apptainer --version`.

Prints each difference as "profile says X, the site says Y", the site's facts the profile
has no field for, and what could not be read. With `--write`, writes the profile where
the one in force came from (its file: in ~/.config/train/clusters/, $TRAIN_CLUSTERS_PATH or
--profile; for a shipped profile ~/.config/train/clusters/NAME.yaml, `extends: NAME`)
holding the probed values, each with a comment saying the date and the command that gave
it. Nothing is guessed: a value no command
could read stays as the profile had it, and the comment says so. An earlier file there is
kept first as NAME.yaml.1 (.2, ...: a kept copy is never replaced).

Each command runs at most --timeout seconds (30) in a process group of its own, killed
whole; its output is read without terminal escape sequences.

A partition whose nodes differ is described by its smallest node (CPUs, memory, GPUs): a
job that fits it fits every node; the GPU types are all the nodes' types.

The probe lives in four modules: site (reading and parsing what Slurm says), compare (the
differences and the site's other facts), write (the user profile --write writes) and
command (what is printed, and `probe`). Their names are re-exported here.
"""
