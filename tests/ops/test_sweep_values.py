"""Sweep specifications: parsing, the cartesian product, and validation before anything exists
on disk or in the queue."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hpctrain.cli import cli
from hpctrain.config import yamlio
from hpctrain.errors import UsageError
from hpctrain.submission.sweep_values import combinations, expand, parse_axes, parse_axis
from tests.conftest import REPO, hpctrain
from tests.ops.helpers import OPS_JOB, ops_job, ops_profile, write_checkpoint


@pytest.fixture(scope="module")
def job_file(tmp_path_factory) -> str:
    """tests/ops/tiny-ops.yaml with a global batch of 8 (fits 4 ranks of data parallelism) and a
    lower min_lr (the sweeps below go down to lr 1e-4)."""
    data = yamlio.read_mapping(OPS_JOB)
    data["batch"]["global_batch_size"] = 8
    data["train"]["min_lr"] = 1.0e-5
    data["data"]["path"] = str(REPO / "examples" / "data" / "kjv_byte")
    data["data"]["prepare_from"] = [str(REPO / "examples" / "corpus" / "kjv.txt.gz")]
    path = tmp_path_factory.mktemp("sweep-values") / "job.yaml"
    yamlio.write_atomic(path, yamlio.dump(data))
    return str(path)


def test_values_are_yaml_scalars_in_the_given_order():
    axis = parse_axis("train.lr=1e-4, 3.0e-4,0.001")
    assert axis.key == "train.lr" and axis.values == (1e-4, 3.0e-4, 0.001)  # YAML 1.2 core: 1e-4 is a number
    assert parse_axis("train.schedule=cosine,wsd").values == ("cosine", "wsd")
    assert parse_axis("model.add_bias_linear=true,false").values == (True, False)


def test_product_varies_the_first_axis_slowest():
    axes = parse_axes(["train.lr=1,2", "batch.global_batch_size=4,8,16"])
    assert combinations(axes) == [
        {"train.lr": 1, "batch.global_batch_size": 4}, {"train.lr": 1, "batch.global_batch_size": 8},
        {"train.lr": 1, "batch.global_batch_size": 16}, {"train.lr": 2, "batch.global_batch_size": 4},
        {"train.lr": 2, "batch.global_batch_size": 8}, {"train.lr": 2, "batch.global_batch_size": 16}]


@pytest.mark.parametrize("spec, message", [
    ("train.lr", "expected KEY=V1,V2"),
    ("lr=1e-4", "not a dotted job-file key"),
    ("train.lr=1e-4,,3e-4", "empty value"),
    ("train.lr=1e-4,1e-4", "listed twice"),
    ("train.lr={a: 1}", "not a single value"),
    # the text as typed is one line of printable text: YAML would fold this one into 'a b'
    ("train.schedule=a\nb", r"holds a line feed \(\\n\) at position 16"),
    ("train.schedule=cosine,a\u2028b", r"holds a line separator \(U\+2028\)"),
])
def test_bad_specs_say_what_to_write(spec, message):
    with pytest.raises(UsageError, match=message):
        parse_axis(spec)


def test_each_combination_is_a_resolved_job_with_its_values(job_file):
    points = expand(job_file, ops_profile(ranks_per_node=2), ["train.lr=1e-4,3e-4", "batch.global_batch_size=4,8"])
    assert [(p.resolved.job.train.lr, p.resolved.job.batch.global_batch_size) for p in points] == \
        [(1e-4, 4), (1e-4, 8), (3e-4, 4), (3e-4, 8)]
    assert [p.index for p in points] == [0, 1, 2, 3]
    assert points[3].resolved.layout.num_microbatches == 2  # gbs 8 / (mbs 2 × DP 2)


def test_every_invalid_combination_is_reported_at_once(job_file):
    with pytest.raises(UsageError) as err:
        expand(job_file, ops_profile(ranks_per_node=2), ["batch.global_batch_size=8,6,7"])
    text = str(err.value)
    assert text.startswith("2 of 3 sweep combinations are invalid; nothing was submitted")
    assert "[sweep batch.global_batch_size=6]" in text and "[sweep batch.global_batch_size=7]" in text
    assert "batch.global_batch_size: 6 is not divisible by micro_batch_size (2) × DP (2) = 4" in text
    assert "=8]" not in text
    assert "\n" not in text                                  # one line, as every usage error
    with pytest.raises(UsageError) as err:                  # many: the first five, then a count
        expand(job_file, ops_profile(ranks_per_node=2),
               ["batch.global_batch_size=" + ",".join(str(n) for n in range(1, 22))])
    text = str(err.value)
    assert text.startswith("16 of 21 sweep combinations are invalid; nothing was submitted: ")
    assert text.count("[sweep ") == 5 and text.endswith("; and 11 more") and "\n" not in text


def test_labels_of_values_from_the_api_stay_on_one_line(job_file):
    """An API caller's values are not typed text: a line break or a long value in one is
    quoted and cut in the ``[--set ...]`` / ``[sweep ...]`` label, never printed as it is."""
    from hpctrain.config import load_job
    from hpctrain.submission.sweep_values import label, with_overrides
    assert label({"train.lr": 0.001, "train.schedule": "wsd"}) == "train.lr=0.001, train.schedule=wsd"
    assert label({"train.schedule": "a\nb"}) == "train.schedule='a\\nb'"
    assert len(label({"data.path": "x" * 100_000})) < 100
    with pytest.raises(UsageError) as err:
        with_overrides(load_job(job_file), {"train.schedule": "a\n\nb" + "y" * 10_000},
                       REPO, job_file)
    assert "\n" not in str(err.value) and len(str(err.value)) < 400, str(err.value)


def test_unknown_keys_get_the_job_files_did_you_mean(job_file):
    with pytest.raises(UsageError, match=r"train\.lrr: unknown key \(did you mean 'lr'\?\)"):
        expand(job_file, ops_profile(ranks_per_node=2), ["train.lrr=1,2"])
    with pytest.raises(UsageError, match="--sweep train.lr.x: train.lr is not a section"):
        expand(job_file, ops_profile(ranks_per_node=2), ["train.lr.x=1"])


def test_cli_refuses_a_sweep_that_breaks_the_layout_before_creating_anything(job_file, tmp_path):
    root = tmp_path / "runs"
    proc = hpctrain("submit", job_file, "-p", "dev-slurm", "--runs-dir", str(root),
                    "--sweep", "parallel.tensor_model_parallel_size=1,3")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "1 of 2 sweep combinations are invalid; nothing was submitted" in proc.stderr
    assert "parallel.tensor_model_parallel_size=3" in proc.stderr
    assert not root.exists()


@pytest.mark.parametrize("args, message", [
    (["--sweep", "train.lr=1,2", "--chain", "2"], "--chain with --sweep"),
    (["--max-parallel", "2"], "--max-parallel limits a sweep"),
    (["--sweep", "train.lr=1,2", "--max-parallel", "0"], "Invalid value for '--max-parallel': 0 is not in the range 1<=x"),
    (["--chain", "2", "-p", "local"], "--chain needs a Slurm profile"),
])
def test_cli_option_mistakes_are_one_line_usage_errors(job_file, tmp_path, args, message):
    argv = ["submit", job_file, "--runs-dir", str(tmp_path / "runs")] + args
    if "-p" not in args:
        argv += ["-p", "dev-slurm"]
    res = CliRunner().invoke(cli, argv)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.startswith("Error:")]
    assert message in res.stderr and len(lines) == 1, res.stderr   # click adds its usage lines


def _tokenizer(folder):
    """A small Hugging Face tokenizer folder (another tokenizer than the data's ``byte``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["in the beginning god created the heaven and the earth"] * 20,
                            trainer=trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>"]))
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    return folder


def _dry_run(root, job_file, *args):
    return CliRunner().invoke(cli, ["submit", job_file, "-p", "dev-slurm", "--dry-run",
                                    "--runs-dir", str(root), *args])


def _refused(root, job_file, *args) -> str:
    """The one error line of a sweep's dry run refused before any folder was created."""
    res = _dry_run(root, job_file, *args)
    assert res.exit_code == 2, (res.stdout, res.stderr)
    (line,) = res.stderr.splitlines()
    assert not root.exists()
    return line


def test_every_sweep_point_is_checked_against_the_prepared_data(job_file, tmp_path):
    """The data is checked for each point, not once for the first: a second point naming
    another tokenizer, or a vocabulary the data's ids do not fit, is refused as a single
    submission of it would be, before any run folder is created."""
    ops_job()                                              # the token data, prepared once
    data = REPO / "examples" / "data" / "kjv_byte"
    tok = _tokenizer(tmp_path / "tok")
    root = tmp_path / "runs"
    assert _refused(root, job_file, "--sweep", f"data.tokenizer=byte,{tok}") == (
        f"Error: data.tokenizer: {data} was prepared with 'byte', the job names '{tok}'; point "
        f"data.path at a new prefix to prepare it there, or remove {data}.bin/.idx/.meta.json "
        f"to prepare it again")
    assert _refused(root, job_file, "--sweep", "model.vocab_size=257,200") == (
        "Error: model.vocab_size: 200 is smaller than the tokenizer's vocabulary (257); set it "
        "to at least 257")


def test_every_sweep_point_is_checked_for_its_init_from(job_file, tmp_path):
    """``train.init_from`` is checked for every point, as ``submit`` checks a single job's."""
    ops_job()
    good, also = tmp_path / "ck", tmp_path / "ck2"
    for ck in (good, also):
        write_checkpoint(ck, 4, attempt=1, run_id="other-run")
    (tmp_path / "empty").mkdir()
    root = tmp_path / "runs"
    assert _refused(root, job_file, "--sweep",
                    f"train.init_from={good},{tmp_path / 'empty'}") == (
        f"Error: train.init_from: {tmp_path / 'empty'} holds no complete checkpoint")
    res = _dry_run(root, job_file, "--sweep", f"train.init_from={good},{also}")
    assert res.exit_code == 0, res.stderr
    assert len(list((root / "sweeps").iterdir())) == 1


def test_a_quoted_value_may_hold_commas_and_a_bracketed_list_is_one_value():
    """``data.split`` is text with commas: quoted, it is one value for ``--set`` and each of a
    ``--sweep``'s values; ``[1,2]`` is one value (a list, refused as one) instead of ``'[1'``
    and ``'2]'``; a quote left open is said."""
    from hpctrain.submission.sweep_values import parse_axis, parse_overrides
    assert parse_overrides(['data.split="969,30,1"']) == {"data.split": "969,30,1"}
    assert parse_axis("data.split='98,1,1', \"90,5,5\"").values == ("98,1,1", "90,5,5")
    assert parse_axis("train.lr=1e-4,3e-4").values == (1e-4, 3e-4)
    with pytest.raises(UsageError, match=r"'\[1,2\]' is not a single value"):
        parse_axis("train.lr=[1,2]")
    with pytest.raises(UsageError, match=r"a quote \('\) is not closed"):
        parse_axis("train.lr='1e-4,3e-4")


def test_null_and_booleans_are_echoed_as_a_job_file_spells_them(job_file):
    from hpctrain.config import load_job
    from hpctrain.submission.sweep_values import label, with_overrides
    assert label({"train.steps": None, "a.b": True, "c.d": False}) == \
        "train.steps=null, a.b=true, c.d=false"
    with pytest.raises(UsageError) as err:
        with_overrides(load_job(job_file), {"train.steps": None}, REPO, job_file)
    assert "[--set train.steps=null]" in str(err.value) and "None" not in str(err.value)


def test_an_api_sweep_value_with_commas_is_passed_quoted(job_file, tmp_path):
    import hpctrain
    runs = hpctrain.submit(job_file, profile=ops_profile(ranks_per_node=2), dry_run=True,
                           runs_dir=tmp_path / "runs", sweep={"data.split": ["98,1,1", "90,5,5"]})
    assert [r.resolved_job().data.split for r in runs] == ["98,1,1", "90,5,5"]
    with pytest.raises(UsageError, match=r"cannot be a sweep value"):
        hpctrain.submit(job_file, dry_run=True, runs_dir=tmp_path / "more",
                        sweep={"data.split": ['98,1,"1']})

