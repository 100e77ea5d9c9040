"""Session fixtures for the megatron-core tests: the example corpus prepared by the CLI, one
model-only initial checkpoint shared by every layout, and a cache of finished runs so a
reference run is trained once per session however many tests compare against it."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from tests.conftest import hpctrain
from tests.launch import Launch, launch
from tests.runtime.helpers import CORPUS, job_mapping, make_run, result, world_of


@pytest.fixture
def lines():
    """What this process's ``hpctrain`` logger says (INFO and up), message by message: the
    lines a rank's log would hold, for code run in the test's own process."""
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    log = logging.getLogger("hpctrain")
    log.addHandler(handler)
    # setLevel, not an assignment to ``level``: setLevel clears the loggers' cached answers
    # to isEnabledFor, so an INFO call made earlier in this process (at the default level,
    # cached as disabled) cannot drop what this test's code logs.
    level = log.level
    log.setLevel(logging.INFO)
    yield said
    log.removeHandler(handler)
    log.setLevel(level)


class Workspace:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data" / "kjv_byte"
        self.init = root / "init-weights"
        self.runs: dict[str, object] = {}
        self._n = 0

    def new_run(self, name: str, layout: str, steps: int = 12, world: int | None = None,
                profile: dict | None = None, **sections):
        self._n += 1
        train = {"init_from": str(self.init), **sections.pop("train", {})}
        job = job_mapping(self.data, layout, steps=steps, train=train, **sections)
        return make_run(self.root / "runs", f"{self._n:02d}-{name}", job,
                        world or world_of(layout), profile)

    def train(self, name: str, layout: str, env: dict | None = None, expect: int = 0,
              world: int | None = None, timeout: float = 300, mode: str = "fork", **job):
        """A run trained to the end (asserting every rank's exit code)."""
        run = self.new_run(name, layout, world=world, **job)
        res = launch(run.path, world or world_of(layout), env=env, timeout=timeout, mode=mode)
        assert res.codes == [expect] * len(res.codes), _explain(res)
        return run, res

    def reference(self, layout: str):
        """The uninterrupted 12-step run of ``layout`` (checkpoint at step 6), trained once."""
        if layout not in self.runs:
            # recomputation must not change the numbers: one layout runs with it
            extra = {"train": {"recompute_granularity": "selective"}} \
                if layout == "tp2dp2_zero1" else {}
            self.runs[layout] = self.train(f"ref-{layout}", layout,
                                           checkpoint={"interval_steps": 6, "async_save": True},
                                           mode="exec" if layout == "single" else "fork",
                                           **extra)[0]
        return self.runs[layout]


def _explain(res) -> str:
    parts = [f"exit codes {res.codes} after {res.seconds:.0f}s"]
    for r in range(len(res.codes)):
        parts.append(f"--- rank {r} (last lines) ---\n{res.tail(r, 25)}")
    return "\n".join(parts)


@pytest.fixture(scope="session")
def ws(tmp_path_factory) -> Workspace:
    w = Workspace(tmp_path_factory.mktemp("megatron"))
    proc = hpctrain("data", "prepare", str(CORPUS), "--output", str(w.data))
    assert proc.returncode == 0, proc.stderr
    run = make_run(w.root / "runs", "00-export", job_mapping(w.data, "single"), 1)
    started = time.time()
    res = Launch(run.path, 1, module="hpctrain.runtime.init_weights",
                 args=[str(run.path), str(w.init)]).wait(300)
    assert res.codes == [0], _explain(res)
    assert (w.init / "manifest.json").exists(), f"no export after {time.time() - started:.0f}s"
    return w


__all__ = ["Workspace", "ws", "result"]
