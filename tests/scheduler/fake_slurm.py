"""Slurm's commands answering from a state file, in the formats captured from Slurm 22.05
(``tests/fixtures/slurm``), so the batch shell's decisions run in-process in a second.

The batch shell's steps (``batch_steps``) ask Slurm about the job, its nodes and its steps,
and act on it (hold, exclude, resize, release, kill a step, run the node check). On the real
dev cluster those paths run in the drills (``tests/resilience``, ``test_gate_release.py``),
minutes each, with the failures a shared machine can stage. Here the state behind each
answer is set by the test (a node DOWN, a job being preempted, a release refused twice), the
real parsers in ``commands`` read the answers, and every command is recorded in the order it
ran, so a story can say what was done to the job, not only what was printed.

``FakeSlurm(tmp_path, monkeypatch)`` puts ``scontrol``, ``squeue``, ``scancel``, ``srun``,
``sacct`` and ``sbatch`` first on PATH (``sbatch`` queues a pending job under the next id,
from ``next_job_id``). ``state`` is a plain dict (jobs, nodes, partitions,
steps, failures, the node check's answer, the steps a kill cannot end, what a hold changes in
the job's record, and ``answers``: a tool's canned output, exit code and delay), saved with
:meth:`save`; :meth:`calls` lists what ran.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"

_TOOL = r'''
import json, os, re, sys
from pathlib import Path

STATE = Path(os.environ["FAKE_SLURM_STATE"])
FIXTURES = Path(os.environ["FAKE_SLURM_FIXTURES"])
tool, args = Path(sys.argv[0]).name, sys.argv[1:]
state = json.loads(STATE.read_text())
with open(STATE.parent / "calls.jsonl", "a") as f:
    f.write(json.dumps([tool, *args]) + "\n")


def save():
    STATE.write_text(json.dumps(state))


def expand(hostlist):
    out = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", hostlist):
        m = re.fullmatch(r"(.*)\[(.*)\]", part)
        if not m:
            out.append(part)
            continue
        for r in m.group(2).split(","):
            a, _, b = r.partition("-")
            out += [f"{m.group(1)}{i}" for i in range(int(a), int(b or a) + 1)]
    return out


def fill(template, values):
    for key, value in values.items():
        template, n = re.subn(rf"(?<=\s){re.escape(key)}=\S*", f"{key}={value}", " " + template)
        template = template[1:]
        if not n:
            template = template.rstrip("\n") + f"\n   {key}={value}\n"
    return template


def fail_if_told(name):
    times, message = state.get("fail", {}).get(name, [0, ""])
    if times:
        state["fail"][name] = [times - 1, message]
        save()
        sys.stderr.write(message + "\n")
        sys.exit(1)


def answer_if_canned():
    """``state["answers"][tool]``: this tool's canned answer (``out``, ``err``, ``rc``, or
    ``signal``: the number it is killed by), after ``sleep`` seconds (a command that does not
    answer in time)."""
    canned = state.get("answers", {}).get(tool)
    if canned is None:
        return
    import time
    time.sleep(canned.get("sleep", 0))
    sys.stdout.write(canned.get("out", ""))
    sys.stderr.write(canned.get("err", ""))
    if canned.get("signal"):             # killed by a signal (the OOM killer, a timeout)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), canned["signal"])
    sys.exit(canned.get("rc", 0))


answer_if_canned()


def job(job_id):
    j = state["jobs"].get(job_id.split("_")[0])
    if j is None:
        sys.stderr.write(f"slurm_load_jobs error: Invalid job id specified\n")
        sys.exit(1)
    return j


if tool == "scontrol":
    verb = args[0]
    if verb == "show":
        what, name = args[1], (args[2] if len(args) > 2 else "")
        if what == "hostnames":
            print("\n".join(expand(name)))
        elif what == "job":
            print(fill((FIXTURES / "scontrol_show_job.txt").read_text(),
                       {"JobId": name, **job(name)}))
        elif what == "node":
            fail_if_told("show node")
            template = (FIXTURES / "scontrol_show_node.txt").read_text()
            names = expand(name) if name else list(state["nodes"])
            print("\n".join(fill(template, {"NodeName": n, **state["nodes"][n]})
                            for n in names if n in state["nodes"]))
        elif what == "partition":
            print(fill((FIXTURES / "scontrol_show_partition.txt").read_text(),
                       {"PartitionName": name, "Nodes": state["partitions"][name]}))
    else:
        fail_if_told(verb)
        if verb == "requeuehold":    # Slurm: a requeued job's NumNodes counts only the nodes
            job(args[1]).update(state.get("after_hold", {}))    # still completing
            save()
        if verb == "update":
            fields = dict(a.split("=", 1) for a in args[1:])
            job(fields.pop("JobId")).update(fields)
            save()
elif tool == "squeue":
    job_id = args[args.index("-j") + 1]
    if "--steps" in args:
        for step, nodes in state.get("steps", {}).items():
            if step.split(".")[0] == job_id:
                print(f"{step} {nodes}" if "%N" in args[args.index("-o") + 1] else step)
        print(f"{job_id}.batch {expand(job(job_id)['NodeList'])[0]}")
    else:
        # every job asked about that Slurm still knows; none known: Slurm's refusal
        known = [i for i in job_id.split(",") if i.split("_")[0] in state["jobs"]]
        if not known:
            job(job_id)
        for i in known:
            j = job(i)
            print("|".join([i, "hpctrain", j.get("JobState", "RUNNING"), j.get("Reason", "None"),
                            j.get("Partition", "debug"), j.get("NodeList", ""),
                            j.get("NumNodes", "1"), "0:02", "5:00", "2026-11-25T22:23:51",
                            j.get("EndTime", "Unknown")]))
elif tool == "scancel":
    fail_if_told("scancel")
    for step in [a for a in args if not a.startswith("-")]:
        if step not in state.get("stuck", []):    # a step on a node Slurm lost stays listed
            state.get("steps", {}).pop(step, None)
    save()
elif tool == "sbatch":     # queued under the next id, pending
    fail_if_told("sbatch")
    new_id = str(state.get("next_job_id", 100))
    state["next_job_id"] = int(new_id) + 1
    state["jobs"][new_id] = {"JobState": "PENDING", "Reason": "Priority"}
    save()
    print(f"Submitted batch job {new_id}")
elif tool == "srun":
    answer = state.get("srun", {"rc": 0, "out": "node check passed"})
    print(answer["out"])
    sys.exit(answer["rc"])
'''


class FakeSlurm:
    TOOLS = ("scontrol", "squeue", "scancel", "srun", "sacct", "sbatch")

    def __init__(self, folder: Path, monkeypatch, **state) -> None:
        self.folder = Path(folder) / "fake-slurm"
        self.folder.mkdir(parents=True)
        script = self.folder / "slurm_tool.py"
        script.write_text(f"#!{sys.executable}\n" + _TOOL)
        for tool in self.TOOLS:
            (self.folder / tool).symlink_to(script)
        script.chmod(0o755)
        self.state = {"jobs": {}, "nodes": {}, "partitions": {}, "steps": {}, "fail": {},
                      **state}
        self.save()
        monkeypatch.setenv("FAKE_SLURM_STATE", str(self.folder / "state.json"))
        monkeypatch.setenv("FAKE_SLURM_FIXTURES", str(FIXTURES))
        monkeypatch.setenv("PATH", f"{self.folder}:/usr/bin:/bin")

    def save(self) -> None:
        (self.folder / "state.json").write_text(json.dumps(self.state))

    def load(self) -> dict:
        self.state = json.loads((self.folder / "state.json").read_text())
        return self.state

    def calls(self, tool: str | None = None) -> list[list[str]]:
        """Every command that ran (argv, the tool's name first), in order."""
        path = self.folder / "calls.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() \
            else []
        return [r for r in rows if tool is None or r[0] == tool]

    def acted(self) -> list[list[str]]:
        """The commands that changed something (not the reading ones)."""
        return [r for r in self.calls() if r[0] in ("scancel", "srun", "sbatch")
                or (r[0] == "scontrol" and r[1] != "show")]
