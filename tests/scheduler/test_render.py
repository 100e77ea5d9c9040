"""The rendered sbatch script: golden files, quoting of hostile values, and Slurm's own verdict."""

from __future__ import annotations

import dataclasses
import difflib
import os
import subprocess

import pytest

from hpctrain.config import load_job, load_profile, profile_from_mapping, resolve
from hpctrain.config.schema import to_dict
from hpctrain.scheduler.slurm.commands import sbatch_test_only
from hpctrain.scheduler.slurm.render import ScriptInputs, render_sbatch
from tests.conftest import REPO, hpctrain

GOLDEN = REPO / "tests" / "golden"
CASES = {
    "tiny-dev-slurm": ("tiny.yaml", "dev-slurm", {}),
    "tiny-dev-slurm-gate": ("tiny.yaml", "dev-slurm", {"preflight": {"gate": True}}),
    # the gate on every node of the allocation, spares too; restarts inside it
    "tiny-dev-slurm-spares-gate": ("tiny.yaml", "dev-slurm", {"preflight": {"gate": True},
                                                             "resilience": {"spare_nodes": 1}}),
    "llama2-7b-h100-ib-pyxis": ("llama2-7b.yaml", "h100-ib-pyxis", {}),
    "llama2-7b-a100-roce": ("llama2-7b.yaml", "a100-roce", {}),
}


def profile_with(name: str, changes: dict):
    data = to_dict(load_profile(name))
    for section, values in changes.items():
        if isinstance(values, dict):
            data.setdefault(section, {}).update(values)
        else:
            data[section] = values
    return profile_from_mapping(data, f"{name} (test variant)")


def render_case(example: str, profile, run_dir: str = "/runs/case") -> str:
    r = resolve(load_job(REPO / "examples" / example), profile)
    return render_sbatch(r, ScriptInputs(run_dir=run_dir, python="/usr/bin/python3",
                                         step_python="/usr/bin/python3",
                                         submitit_dir=f"{run_dir}/submitit"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendered_script_matches_golden_file(case):
    example, profile_name, changes = CASES[case]
    text = render_case(example, profile_with(profile_name, changes), run_dir=f"/runs/{case}")
    golden = GOLDEN / f"{case}.sbatch"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    expected = golden.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True),
                                            f"golden/{case}.sbatch", "rendered"))
        pytest.fail(f"rendered script differs from the golden file (UPDATE_GOLDEN=1 to accept):\n{diff}")


def test_render_is_pure():
    p = load_profile("dev-slurm")
    assert render_case("tiny.yaml", p) == render_case("tiny.yaml", p)


def test_directives_follow_the_profile():
    text = render_case("llama2-7b.yaml", load_profile("a100-roce"))
    for line in ["#SBATCH --gres=gpu:8", "#SBATCH --constraint=a100-80g",
                 "#SBATCH --exclude=gpu-a100-017", "#SBATCH --signal=B:USR2@240",
                 "#SBATCH --requeue", "module load cuda/12.4", "trap 'on_signal USR2' USR2"]:
        assert line in text, line


HOSTILE = "x'; touch {marker}; echo '$(touch {marker})`touch {marker}`"


def test_hostile_values_are_inert(tmp_path):
    """A profile value never runs a command: env values and paths are quoted in the script."""
    marker = tmp_path / "pwned"
    value = HOSTILE.format(marker=marker)
    profile = profile_with("dev-slurm", {"env": {"NCCL_DEBUG": value}})
    run_dir = str(tmp_path / "run dir with spaces")
    os.makedirs(run_dir)           # the script changes into it
    text = render_case("tiny.yaml", profile, run_dir=run_dir)
    head = text.split("# Runs one step")[0]          # directives, variables and exports only
    probe = head + '\nprintf "%s" "$NCCL_DEBUG" > "$1"\nprintf "%s" "$RUN_DIR" > "$2"\n'
    out1, out2 = tmp_path / "env_value", tmp_path / "run_dir"
    subprocess.run(["bash", "-c", probe, "probe", str(out1), str(out2)], check=True, timeout=30)
    assert not marker.exists()
    assert out1.read_text() == value
    assert out2.read_text() == run_dir
    assert subprocess.run(["bash", "-n", "-c", text]).returncode == 0


def test_render_cli_refuses_local_profile():
    proc = hpctrain("render", "examples/tiny.yaml", "--profile", "local")
    assert proc.returncode == 2
    assert "runs without Slurm" in proc.stderr


def dev_variant(name: str):
    """A shipped profile bent to fit the dev cluster (its partitions and 2 × 4 fake GPUs), so
    Slurm itself can judge the script's directives, extra directives and gres forms."""
    p = load_profile(name)
    slurm = dataclasses.replace(p.slurm, partition="debug", account=None, qos=None, reservation=None,
                                constraint=None, exclude=[], mem=None, exclusive=False, nodes=2,
                                gpus_per_node=min(p.slurm.gpus_per_node, 2),
                                time_limit="00:30:00", cpus_per_task=1)
    pre = dataclasses.replace(p.preemption, lead_time_s=min(p.preemption.lead_time_s, 60))
    return dataclasses.replace(p, slurm=slurm, preemption=pre)


@pytest.mark.slurm
@pytest.mark.parametrize("example, profile_name", [("tiny.yaml", "dev-slurm"),
                                                   ("llama2-7b.yaml", "h100-ib-pyxis"),
                                                   ("llama2-7b.yaml", "a100-roce")])
def test_sbatch_test_only_accepts_rendered_scripts(slurm_cluster, tmp_path, example, profile_name):
    profile = dev_variant(profile_name) if profile_name != "dev-slurm" else load_profile(profile_name)
    job = load_job(REPO / "examples" / example)
    job.parallel.tensor_model_parallel_size = min(job.parallel.tensor_model_parallel_size,
                                                  profile.slurm.gpus_per_node)
    r = resolve(job, profile)
    script = tmp_path / "job.sbatch"
    script.write_text(render_sbatch(r, ScriptInputs(run_dir=str(tmp_path / "run"),
                                                    python="/usr/bin/python3",
                                                    step_python="/usr/bin/python3",
                                                    submitit_dir=str(tmp_path / "run/submitit"))))
    verdict = sbatch_test_only(str(script))
    assert "to start at" in verdict, verdict


@pytest.mark.slurm
def test_sbatch_test_only_refuses_what_slurm_refuses(slurm_cluster, tmp_path):
    profile = dataclasses.replace(load_profile("dev-slurm"), slurm=dataclasses.replace(
        load_profile("dev-slurm").slurm, gpus_per_node=2))
    r = resolve(load_job(REPO / "examples" / "tiny.yaml"), profile)
    text = render_sbatch(r, ScriptInputs(run_dir=str(tmp_path), python="python3",
                                         step_python="python3", submitit_dir=str(tmp_path)))
    script = tmp_path / "bad.sbatch"
    script.write_text(text.replace("--partition=debug", "--partition=nosuchpartition"))
    with pytest.raises(Exception, match="invalid partition|Invalid partition"):
        sbatch_test_only(str(script))


def test_step_script_of_a_job_that_trains_nothing():
    from hpctrain.scheduler.slurm.render import render_step_script
    text = render_step_script(load_profile("h100-ib-pyxis"), ScriptInputs(
        run_dir="/runs/pf", python="/usr/bin/python3", step_python="python3",
        submitit_dir="/runs/pf/submitit", kind="preflight"))
    assert "#SBATCH --job-name=hpctrain-preflight" in text
    assert "#SBATCH --no-requeue" in text and "--signal" not in text
    assert "hooks begin" not in text and "submitit.core._submit /runs/pf/submitit" in text
    assert "--container-image=/lustre/fsw/llm-pretrain/images/hpctrain-ngc25.11.sqsh" in text
    assert subprocess.run(["bash", "-n", "-c", text]).returncode == 0
