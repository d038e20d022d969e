"""The DQN agent for StarCraft II mini-games: network, replay buffer, agent, trainer."""
