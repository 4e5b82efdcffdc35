"""Tests of the copier template (copier.yml, template/): the projects it generates, and their updates."""
