"""A Lightning template for training on one CPU, one GPU, several GPUs (dp, ddp, ddp_spawn) and SLURM clusters."""
