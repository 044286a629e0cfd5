"""SFT and RL loops, checkpoints with exact resume, metric logging, the run config."""
