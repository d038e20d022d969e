"""Runtime pieces every workload shares: precision, memory, checkpoints, results,
progress output (distribution and signals are the node's: train.node)."""
