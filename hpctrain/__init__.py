"""hpctrain: from a YAML description to a healthy, self-healing Slurm training job.

From Python::

    import hpctrain
    run = hpctrain.submit("examples/tiny.yaml", profile="dev-slurm")   # -> hpctrain.Run
    run.wait()                     # follows the run to its end, returns its final state
    run.status()                   # what `hpctrain status RUN --json` prints
    run.metrics()                  # the metrics records
    hpctrain.plan("examples/llama2-7b.yaml", profile="h100-ib-pyxis")  # `plan --json`'s data
    hpctrain.runs()                # the run folders, newest first, as Run objects
    hpctrain.runs_table()          # their `hpctrain runs --json` rows, in one call
    hpctrain.Run("runs/tiny-gpt-20250101-120000-ab12")                  # an existing run

Importing the package is cheap on purpose (no torch, no megatron, no submitit): the names
above are looked up on first use (PEP 562), and only the paths that train import the runtime.

No module of the package shares a name with them: the planner is ``hpctrain.planner``, the
run folders are ``hpctrain.record``. The layers below the API are described in
``docs/architecture.md``.
"""

__version__ = "0.1.0"

# public name -> (module, attribute), imported on first use
_API = {"submit": ("hpctrain.api", "submit"), "plan": ("hpctrain.api", "plan"),
        "runs": ("hpctrain.api", "runs"), "runs_table": ("hpctrain.api", "runs_table"),
        "Run": ("hpctrain.api", "Run")}

__all__ = ["Run", "__version__", "plan", "runs", "runs_table", "submit"]


def __getattr__(name):
    target = _API.get(name)
    if target is None:
        raise AttributeError(f"module 'hpctrain' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(target[0]), target[1])
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_API))

