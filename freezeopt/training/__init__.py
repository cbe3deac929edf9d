"""Training with a schedule: the runtime hook, the training job around it, and re-planning.

- `runtime`: `FreezeController`, framework-free (no torch, no solver): which groups each
  microbatch skips, the phases, drift rules and fallback. The hook for your own loop.
- `options`: `TrainOptions` and its configs (`PhaseOverrides`, `CheckpointOptions`,
  `ReplanOptions`).
- `train`: `train_job`, the `freezeopt train` command's library call, over `rank` (one rank's
  training loop) and `runlog` (its logs); checkpoints are `freezeopt.torchpp.checkpoint`'s.
- `replan` and `replan_worker`: re-solving from measured costs in a child process while training.

Nothing is imported here: the runtime hook must not load the training job, torch or the solver.
"""
