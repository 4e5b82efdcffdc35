"""One fast test per function of ``src/compat.py``: each fails when the library changes the private name under it."""

from __future__ import annotations

# -- Lightning: the fit loop's counters and switches --------------------------------------------------------

# -- Lightning: checkpointing, strategies, launchers --------------------------------------------------------

# -- jsonargparse and LightningCLI --------------------------------------------------------------------------

# -- torch --------------------------------------------------------------------------------------------------
