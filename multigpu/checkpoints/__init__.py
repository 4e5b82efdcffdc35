"""Checkpoints: written atomically (``files``), in the background (``background``), sharded (``sharded``), read
without running code (``safe``), resolved for a command (``resume``), made one file (``consolidate``)."""
