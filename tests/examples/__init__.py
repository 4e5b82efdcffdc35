"""Tests of the example workloads (the image and language models, their data modules)."""
