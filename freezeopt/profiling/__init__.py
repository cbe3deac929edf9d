"""Profiles: a real pipelined run measured (`run.profile_job`, assembled by `assemble`) or a
synthetic one (`synth.synth_profile`), written as a `freezeopt.formats.profile.Profile`.

Nothing is imported here: importing this package does not load torch.
"""
