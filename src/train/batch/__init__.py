"""The batch shell: the chain library (job-lib.sh, job-lib-step.sh, job-lib-resume.sh)
every rendered script inlines, and the contract (names of files, events, variables) it
shares with Python."""
