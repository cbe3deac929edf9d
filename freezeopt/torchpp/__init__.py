"""freezeopt inside torch: the one door to torch's pipelining internals, jobs, pipelines, ranks.

- `adapter`: the only module that touches torch's private pipelining names (`_Action`, the
  schedules' lowering); `enable_freezing` and `scale_group_grads` (the runtime's two calls on a
  stage), `schedule_actions` (the per-rank action order torch really executes).
- `job`: job specs (`Job`, `load_job`) and what a user's code returns (`ModelParts`, `DataParts`).
- `pipeline`: stages, groups and a torch schedule built for one rank (`build_rank_pipeline`).
- `launch`: the rank processes (gloo/nccl, forked or under torchrun) and their failure.
- `checkpoint`: the ranks' states on disk (atomic, checksummed, read weights-only), which training
  resumes from and `weights` starts a job from (`init:`, fine-tuning a trained run).
- `faults`: the test-only faults injected into profile and train runs (one vocabulary).

Nothing is imported here: importing this package does not load torch.
"""
