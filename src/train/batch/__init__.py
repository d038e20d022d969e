"""The batch host's side: the chain engine (engine, chunk, task, saves) that every job
script hands its chunk to, copied into the run folder at submit, and the contract (names
of files, events, variables) it shares with the rest of train. Standard library only,
valid Python 3.6; it imports nothing of train outside this package."""
