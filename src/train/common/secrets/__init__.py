"""What is recorded or logged of the environment and of command lines, without secrets:
names (which names hold a secret, judged by words, not substrings), commands (command lines
and any text with their secrets masked) and environment (the variables recorded: those known
to hold no secret verbatim, the rest redacted)."""
