"""The command line to the Trainer, in order: ``cli`` (``TemplateCLI``: parse, facts, checks, run directory,
checkpoint, build, run), ``parser``, ``checks``, ``run_lock`` and ``run_dir``, ``trainer`` (the callbacks and what
else the Trainer gets)."""
