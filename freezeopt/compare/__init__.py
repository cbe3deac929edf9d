"""Policies trained side by side: `run.compare_job` (the `freezeopt compare` command), the
baseline schedules (`policies`), TimelyFreeze's LP (`timelyfreeze`).

Nothing is imported here: importing this package does not load torch or the solver.
"""
