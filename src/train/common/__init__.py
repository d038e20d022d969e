"""Shared by every side (login node, batch shell's Python, nodes, workloads): errors, the
subprocess boundary, YAML/JSON, secrets, GPU types, CUDA variants, host memory, entries."""
