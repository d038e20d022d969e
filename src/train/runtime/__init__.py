"""Runtime pieces every workload shares: precision, memory, distribution, checkpoints,
signals and time budget, results, progress output."""
