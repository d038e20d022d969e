"""`train clusters probe NAME [--write]`: what the site's Slurm says (site), against what
the profile says (command), and the profile --write writes (write); docs/sites.md."""
