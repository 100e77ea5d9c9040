"""The door of a job's paths (``config.loader.resolve_job_paths``): every path field is made
absolute and checked there, once, for a job file, ``--set`` values and a sweep's values alike.

A blank path would silently mean the job file's folder; a path behind a symlink loop was an
"internal error: RuntimeError" (Python 3.11's ``Path.resolve``). Each is one error naming the
field, exit 2.
"""

from __future__ import annotations

import copy
import os

import pytest
import yaml
from hypothesis import given, strategies as st

from hpctrain.config import job_from_mapping, load_job
from hpctrain.config.loader import resolve_job_paths
from hpctrain.errors import ConfigError
from tests.conftest import REPO, hpctrain, one_error_line

TINY = yaml.safe_load((REPO / "examples" / "tiny.yaml").read_text())


def _with(field: str, value: str) -> dict:
    """tiny.yaml with the path ``field`` (a key of FIELDS) set to ``value``."""
    data = copy.deepcopy(TINY)
    d = data["data"]
    if field == "data.path":
        d.pop("blend")
        d["path"] = value
    elif field == "data.prepare_from[0]":
        d.pop("blend")
        d["path"] = "data/kjv_byte"
        d["prepare_from"] = [value]
    elif field == "data.blend[0].path":
        d["blend"][0]["path"] = value
    elif field == "data.blend[0].prepare_from[0]":
        d["blend"][0]["prepare_from"] = [value]
    elif field == "data.tokenizer":
        d["tokenizer"] = value
    elif field == "train.init_from":
        data["train"]["init_from"] = value
    elif field == "checkpoint.dir":
        data["checkpoint"]["dir"] = value
    elif field == "tracking.wandb.dir":
        data["tracking"] = {"wandb": {"project": "p", "dir": value}}
    else:
        raise AssertionError(field)
    return data


FIELDS = ["data.path", "data.prepare_from[0]", "data.blend[0].path",
          "data.blend[0].prepare_from[0]", "data.tokenizer", "train.init_from",
          "checkpoint.dir", "tracking.wandb.dir"]


def _problems(data: dict, base) -> list:
    with pytest.raises(ConfigError) as err:
        resolve_job_paths(job_from_mapping(data, "job.yaml"), base, "job.yaml")
    return err.value.problems


@pytest.fixture
def loop(tmp_path):
    """``tmp_path/l1`` -> ``l2`` -> ``l1``."""
    os.symlink("l2", tmp_path / "l1")
    os.symlink("l1", tmp_path / "l2")
    return tmp_path / "l1"


@pytest.mark.parametrize("field", FIELDS)
def test_a_path_behind_a_symlink_loop_is_one_problem_naming_the_field(field, loop, tmp_path):
    for value in (f"{loop}/x", "l1/x"):   # absolute, and relative to the job's folder
        [(path, message)] = _problems(_with(field, value), tmp_path)
        assert path == field and "is behind a symlink loop" in message, message


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("blank", ["", " ", "\u3000"])
def test_a_blank_path_is_one_problem_naming_the_field(field, blank, tmp_path):
    """Before, "" resolved to the job file's folder (job.yaml recorded the folder)."""
    [(path, message)] = _problems(_with(field, blank), tmp_path)
    assert path == field and "is blank; give a path or" in message, message


def test_a_blank_path_in_a_job_file_is_refused_with_the_file_named(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(_with("data.blend[0].path", "")))
    with pytest.raises(ConfigError) as err:
        load_job(job)
    assert str(err.value).startswith(f"{job}: data.blend[0].path: '' is blank")


def test_unset_optional_paths_stay_unset(tmp_path):
    """null is how an optional path is left unset; the door leaves it alone."""
    data = copy.deepcopy(TINY)
    data["train"]["init_from"] = None
    data["checkpoint"]["dir"] = None
    job = resolve_job_paths(job_from_mapping(data, "job.yaml"), tmp_path)
    assert job.train.init_from is None and job.checkpoint.dir is None and job.data.path is None


@given(field=st.sampled_from(FIELDS),
       blank=st.text(st.characters(whitelist_categories=["Zs"]), max_size=5))
def test_any_blank_path_field_is_refused(field, blank):
    """Whatever the field and whatever spaces (none included) stand for its path."""
    [(path, message)] = _problems(_with(field, blank), REPO)
    assert path == field and "is blank" in message


@pytest.mark.parametrize("setting", ["train.init_from={}/x", "data.tokenizer={}/x",
                                     "checkpoint.dir={}/x"])
def test_cli_set_behind_a_symlink_loop_is_a_usage_error(setting, loop, tmp_path):
    proc = hpctrain("validate", "examples/tiny.yaml", "--set", setting.format(loop))
    one_error_line(proc, setting.split("=")[0] + ":", "is behind a symlink loop")
    proc = hpctrain("submit", "--dry-run", "examples/tiny.yaml", "--runs-dir",
                    str(tmp_path / "runs"), "--set", setting.format(loop))
    one_error_line(proc, setting.split("=")[0] + ":", "is behind a symlink loop")


def test_cli_home_behind_a_symlink_loop_is_a_usage_error(loop):
    proc = hpctrain("validate", "examples/tiny.yaml", "--set", "data.tokenizer=~/tok",
                    env={"HOME": str(loop)})
    one_error_line(proc, "data.tokenizer: ~/tok", "is behind a symlink loop")


@pytest.mark.parametrize("setting", ["data.tokenizer=''", "train.init_from=''",
                                     "checkpoint.dir=' '"])
def test_cli_set_blank_path_is_a_usage_error(setting):
    proc = hpctrain("validate", "examples/tiny.yaml", "--set", setting)
    one_error_line(proc, setting.split("=")[0] + ":", "is blank")


def test_render_run_dir_behind_a_symlink_loop_is_a_usage_error(loop):
    proc = hpctrain("render", "examples/tiny.yaml", "-p", "dev-slurm", "--run-dir", f"{loop}/x")
    one_error_line(proc, "--run-dir", "is behind a symlink loop")
