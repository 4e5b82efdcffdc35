"""Every private name of Lightning, jsonargparse and torch that the template relies on, in one place.

Each is a small function with a one-line reason; ``tests/test_compat.py`` has a fast test for each that fails
loudly when a library release renames or changes it. Nothing else in ``src/`` reaches into another object's
internals, so an upgrade of Lightning is checked by running that one test file.
"""

from __future__ import annotations

# -- Lightning: the fit loop's counters and switches --------------------------------------------------------

# -- Lightning: checkpointing, strategies, launchers --------------------------------------------------------

# -- jsonargparse and LightningCLI --------------------------------------------------------------------------

# -- torch --------------------------------------------------------------------------------------------------
