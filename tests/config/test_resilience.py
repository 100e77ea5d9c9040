"""resilience.spare_nodes / max_in_job_restarts: profile and job fields, their errors, what
the job's values change (the job wins), and what they do to the batch script."""

from __future__ import annotations

import pytest
import yaml

from hpctrain.config import job_from_mapping, load_profile, profile_from_mapping, resolve
from hpctrain.config.resilience import effective
from hpctrain.config.schema import to_dict
from hpctrain.errors import ConfigError, UsageError
from hpctrain.scheduler.slurm.render import ScriptInputs, render_sbatch
from tests.config.test_jobs import job
from tests.conftest import hpctrain


def dev_profile(**resilience):
    data = to_dict(load_profile("dev-slurm"))
    data["resilience"] = resilience
    return profile_from_mapping(data, "dev.yaml")


def script(resolved) -> str:
    return render_sbatch(resolved, ScriptInputs(run_dir="/runs/r", python="/usr/bin/python3",
                                                step_python="/usr/bin/python3",
                                                submitit_dir="/runs/r/submitit"))


@pytest.mark.parametrize("value, expect", [(-1, "at least 0"), ("two", "expected an integer"),
                                           (10**6, "at most 1024")])
def test_bad_spare_nodes_name_the_field(value, expect):
    with pytest.raises(ConfigError) as err:
        dev_profile(spare_nodes=value)
    (path, msg), = err.value.problems
    assert path == "resilience.spare_nodes" and expect in msg, msg
    with pytest.raises(ConfigError) as err:
        job_from_mapping(job(resilience__spare_nodes=value), "job.yaml")
    assert err.value.problems[0][0] == "resilience.spare_nodes"


def test_a_local_profile_has_no_spares(tmp_path):
    from hpctrain.scheduler.choose import backend_for
    data = to_dict(load_profile("local"))
    data["resilience"] = {"spare_nodes": 1}
    with pytest.raises(UsageError, match=r"resilience\.spare_nodes: a local profile runs on "
                                         r"this machine only and has no spare nodes"):
        backend_for(profile_from_mapping(data, "p.yaml"))
    # a job's own spares on a local profile: refused once folded into it
    resolved = resolve(job_from_mapping(job(resilience__spare_nodes=1), "job.yaml"),
                       load_profile("local"))
    with pytest.raises(UsageError, match="resilience.spare_nodes"):
        backend_for(resolved.profile)
    path = tmp_path / "spared.yaml"
    path.write_text(yaml.safe_dump(data))
    proc = hpctrain("profiles", "validate", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "resilience.spare_nodes" in proc.stderr


def test_the_job_overrides_the_profile_field_by_field():
    profile = dev_profile(spare_nodes=2, max_in_job_restarts=5)
    own = job_from_mapping(job(resilience__spare_nodes=1), "job.yaml")
    assert effective(own, profile).spare_nodes == 1
    assert effective(own, profile).max_in_job_restarts == 5
    assert effective(job_from_mapping(job(), "job.yaml"), profile).spare_nodes == 2
    assert resolve(own, profile).profile.resilience.spare_nodes == 1
    # unset: 2 restarts with spares; none without, as before in-job restarts existed
    assert effective(own, dev_profile(spare_nodes=2)).max_in_job_restarts == 2
    assert effective(job_from_mapping(job(), "job.yaml"), dev_profile()).max_in_job_restarts == 0
    assert effective(job_from_mapping(job(resilience__max_in_job_restarts=1), "job.yaml"),
                     dev_profile()).max_in_job_restarts == 1


def test_spares_ask_slurm_for_more_nodes_and_keep_the_allocation_on_node_failure():
    plain = script(resolve(job_from_mapping(job(), "job.yaml"), dev_profile()))
    assert "#SBATCH --nodes=2\n" in plain and "--no-kill" not in plain
    spared = script(resolve(job_from_mapping(job(resilience__spare_nodes=1), "job.yaml"),
                            dev_profile()))
    assert "#SBATCH --nodes=3\n" in spared and "#SBATCH --no-kill\n" in spared
    # the training step still runs on slurm.nodes, on the node list the batch step chose
    # (the preflight gate's step alone sets STEP_NODE_COUNT: all of the allocation)
    assert "local count=${STEP_NODE_COUNT:-2}\n" in spared
    assert 'srun --kill-on-bad-exit=1 --unbuffered --nodes="$count" ' in spared
    assert '${HPCTRAIN_STEP_NODES:+"--nodelist=$HPCTRAIN_STEP_NODES"}' in spared


def test_cli_validate_says_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("resilience:\n  max_in_job_restarts: -3\n")
    proc = hpctrain("profiles", "validate", str(bad))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "resilience.max_in_job_restarts:" in proc.stderr
