"""Training environments sharing pysc2's observation and action layout."""
