"""Workloads that `train run` can train: the DQN agent on the demo game or on pysc2."""
