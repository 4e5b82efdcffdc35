"""What goes wrong in a run, and how it ends: a stop signal (preemption), a non-finite loss, a stuck or failing rank
(stack dumps, the hang report, the ranks' stop), whether a process is alive."""
