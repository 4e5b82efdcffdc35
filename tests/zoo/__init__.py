"""Workloads written the way users write them (plain Lightning, their own metric names and optimizers), which
the template must train under every strategy with its default config. Importable by the CLI in subprocesses."""
