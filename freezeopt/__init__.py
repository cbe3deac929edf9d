"""freezeopt: freeze the right parameters at the right time in pipeline-parallel training.

The data flow is profile → DAG → MILP → schedule file → runtime hook. Each step is one module:
`actions` (vocabulary), `torch_pp` (the only door to torch's private pipelining code), `synth`
and `profile_io` (profile files), `dag` and `simulate` (the schedule as a graph and its timing),
`sensitivity` (what freezing a group costs in gradient signal), `solve` (the optimisation),
`schedule` (the committed YAML file) and `cli`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("freezeopt")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

__all__ = ["__version__"]
