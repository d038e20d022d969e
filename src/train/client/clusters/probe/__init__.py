"""`train clusters probe NAME [--write]`: what the site's Slurm says, against what the
profile says (docs/sites.md lists the commands read and what --write does).

sinfo is read with `-o`, not `--json`: its fields are the same from Slurm 22.05 to 25.x,
where the JSON's layout is not. Nothing is guessed: a value no command could read stays as
the profile had it, and the output says so. A partition whose nodes differ is described by
its smallest node (CPUs, memory, GPUs): a job that fits it fits every node.

Modules: site (reading and parsing what Slurm says), write (the user profile --write
writes) and command (the differences and the site's other facts, what is printed, and
`probe`).
"""
