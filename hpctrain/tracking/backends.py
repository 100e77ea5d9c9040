"""The two trackers behind one small interface, each imported only when a run asks for it.

Every method may block (a W&B start, an MLflow HTTP request) or raise (a tracker down): they
are called only from the tracker thread (:mod:`.sender`), which buffers and retries.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .records import describe_event, flat_params, metric_values


@dataclass
class RunInfo:
    """What a tracker run is made from: the hpctrain run and its resolved configuration."""

    run_id: str
    run_path: Path
    job_name: str
    attempt: int
    config: dict                       # {"job": {...}, "profile": {...}}, resolved
    sweep: dict | None = None          # run.yaml's sweep: {"id", "dir", "index", ...}
    sweep_dir: Path | None = None      # its folder, checked (``sweep_folder_for``); else None


def sweep_folder_for(backends: list, run_path: Path, sweep: dict | None,
                     log: Callable[[str], None]) -> Path | None:
    """The sweep folder the trackers may write (MLflow's parent run id): the one ``run.yaml``'s
    ``sweep.dir`` names, when it is this run's sweep folder (:func:`hpctrain.record.sweeps.
    sweep_folder_of`); otherwise None, and ``log`` is told that the run is tracked without a
    parent run. Only asked when an MLflow tracker is among ``backends``."""
    if not sweep or not any(isinstance(b, MlflowBackend) for b in backends):
        return None
    from ..file_door import show
    from ..record.sweeps import sweep_folder_of
    folder, why = sweep_folder_of(run_path, sweep)
    if folder is None:
        log(f"tracking: mlflow: this run of sweep {show(str(sweep.get('id')))} gets no parent "
            f"run: {why}")
    return folder


class Backend:
    name = "tracker"

    def open(self, info: RunInfo, saved: dict) -> None:
        """Start or continue the tracker run; ``saved`` is this tracker's state entry (ids
        are written into it)."""
        raise NotImplementedError

    def log_records(self, records: list[dict]) -> None:
        raise NotImplementedError

    def log_events(self, events: list[tuple[str, dict]], first_index: int) -> None:
        raise NotImplementedError

    def log_file(self, path: Path) -> None:
        raise NotImplementedError

    def close(self, status: str) -> None:
        """``status``: finished, stopped (to be continued) or failed."""
        raise NotImplementedError


class MlflowBackend(Backend):
    """MLflow through :class:`mlflow.MlflowClient` (no global active run: rank 0's only
    MLflow state is this object). A sweep's runs are children of one parent run per sweep."""

    name = "mlflow"

    def __init__(self, section) -> None:
        self.section = section
        self.client = None
        self.run_id: str | None = None

    def open(self, info: RunInfo, saved: dict) -> None:
        # Our thread retries on its own schedule; MLflow's own retries (minutes of backoff)
        # would only hold the buffered records longer. A user's setting wins.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
        from mlflow import MlflowClient
        from mlflow.entities import Param
        uri = self.section.tracking_uri
        self.client = client = MlflowClient(tracking_uri=uri)
        if saved.get("run_id"):
            self.run_id = saved["run_id"]
            client.update_run(self.run_id, status="RUNNING")
            return
        name = self.section.experiment or info.job_name
        exp = client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp is not None else client.create_experiment(name)
        tags = {"hpctrain.run": info.run_id, "hpctrain.job": info.job_name}
        if info.sweep:
            tags["hpctrain.sweep"] = str(info.sweep.get("id"))
            parent = self._sweep_parent(exp_id, info)
            if parent:
                tags["mlflow.parentRunId"] = parent
        run = client.create_run(exp_id, run_name=info.run_id, tags=tags)
        self.run_id = run.info.run_id
        saved.update(run_id=self.run_id, experiment_id=exp_id, tracking_uri=uri)
        params = [Param(k[:250], v[:6000]) for k, v in flat_params(info.config).items()]
        for i in range(0, len(params), 100):        # MLflow takes 100 params per request
            client.log_batch(self.run_id, params=params[i:i + 100])

    def _sweep_parent(self, exp_id: str, info: RunInfo) -> str | None:
        """The sweep's parent run: created by the first of its runs to start, under the sweep
        folder's lock, its id kept in the sweep folder. Only a folder checked to be this run's
        sweep folder (``info.sweep_dir``, :func:`sweep_folder_for`) is used: never another
        run's folder or wherever ``run.yaml`` was edited to point."""
        import json
        from ..record import reader
        from ..record.files import folder_lock
        folder = info.sweep_dir
        if folder is None:
            return None
        ids_file = folder / "mlflow-parent.json"
        with folder_lock(folder / ".lock", "sweep folder"):
            try:
                known = reader.read_json(ids_file) or {}
            except reader.DamagedFile:
                return None         # kept as it is: a parent run made again would be a second
            key = f"{self.section.tracking_uri}|{exp_id}"
            if not isinstance(known.get(key), str):
                parent = self.client.create_run(exp_id, run_name=str(info.sweep.get("id")),
                                                tags={"hpctrain.sweep": str(info.sweep.get("id"))})
                known[key] = parent.info.run_id
                from ..config import yamlio
                yamlio.write_atomic(ids_file, json.dumps(known) + "\n")
            return known[key]

    def log_records(self, records: list[dict]) -> None:
        from mlflow.entities import Metric
        metrics = []
        for rec in records:
            stamp = int(1000 * rec.get("time", time.time()))
            for key, value in metric_values(rec).items():
                metrics.append(Metric(key, value, stamp, rec["step"]))
        for i in range(0, len(metrics), 1000):      # 1,000 metrics per request
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def log_events(self, events: list[tuple[str, dict]], first_index: int) -> None:
        from mlflow.entities import RunTag
        tags = []
        counts: dict[str, int] = {}
        for i, (label, event) in enumerate(events, start=first_index):
            tags.append(RunTag(f"hpctrain.event.{i:04d}.{label}", describe_event(event)))
            counts[label] = counts.get(label, 0) + 1
        known = self.client.get_run(self.run_id).data.tags
        for label, n in counts.items():
            before = int(known.get(f"hpctrain.events.{label}", "0") or 0)
            tags.append(RunTag(f"hpctrain.events.{label}", str(before + n)))
        for i in range(0, len(tags), 100):
            self.client.log_batch(self.run_id, tags=tags[i:i + 100])

    def log_file(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def close(self, status: str) -> None:
        if self.client is None or self.run_id is None:
            return
        self.client.set_terminated(self.run_id, status={"finished": "FINISHED",
                                                        "failed": "FAILED"}.get(status, "KILLED"))


class WandbBackend(Backend):
    """Weights & Biases. Every metric is plotted against hpctrain's own ``step`` (W&B's
    ``define_metric``), not W&B's internal step counter, so a resumed attempt's steps land at
    their training step whatever the counter says. Offline mode writes the run under
    ``dir`` (``RUN/wandb`` by default), one folder per attempt, all with the same run id."""

    name = "wandb"

    def __init__(self, section) -> None:
        self.section = section
        self.run = None

    def open(self, info: RunInfo, saved: dict) -> None:
        import secrets
        import wandb
        s = self.section
        # W&B's own ids are 8 lowercase letters and digits; ours too, chosen once per run
        run_id = saved.get("run_id") or secrets.token_hex(4)
        folder = Path(s.dir) if s.dir else info.run_path / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        group = s.group or (str(info.sweep.get("id")) if info.sweep else None)
        self.run = wandb.init(
            project=s.project, entity=s.entity, group=group, tags=list(s.tags) or None,
            mode=s.mode, dir=str(folder), id=run_id, resume="allow", name=info.run_id,
            config={**info.config, "hpctrain_run": info.run_id},
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True,
                                    init_timeout=120))
        saved.update(run_id=run_id, project=s.project, entity=s.entity, mode=s.mode,
                     dir=str(folder))
        self.run.define_metric("step")
        for kind in ("train", "validation", "test"):
            self.run.define_metric(f"{kind}/*", step_metric="step")

    def log_records(self, records: list[dict]) -> None:
        for rec in records:
            self.run.log({**metric_values(rec), "step": rec["step"]})

    def log_events(self, events: list[tuple[str, dict]], first_index: int) -> None:
        tags = list(self.run.tags or ())
        for label, _ in events:
            if label not in tags:
                tags.append(label)
        self.run.tags = tuple(tags)
        logged = list(self.run.summary.get("hpctrain_events") or [])
        logged += [{"event": label, **{k: v for k, v in e.items() if k != "event"}}
                   for label, e in events]
        self.run.summary["hpctrain_events"] = logged

    def log_file(self, path: Path) -> None:
        import wandb
        self.run.log({"report": wandb.Image(str(path))})

    def close(self, status: str) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if status != "failed" else 1)
            self.run = None


def backends_for(section) -> list[Backend]:
    out: list[Backend] = []
    if section.wandb is not None:
        out.append(WandbBackend(section.wandb))
    if section.mlflow is not None:
        out.append(MlflowBackend(section.mlflow))
    return out
