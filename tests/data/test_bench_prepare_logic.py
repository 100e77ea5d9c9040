"""tools/bench_prepare's own logic, without Megatron-LM: the JSONL it feeds both tools holds
the documents hpctrain reads from the text files (preparing either gives the same bytes), and
a missing Megatron-LM tree is one Error line with exit code 2."""

from __future__ import annotations

import filecmp
import gzip
import json

from hpctrain.data.prepare import prepare
from tests.conftest import tool_module


def _bench():
    return tool_module("bench_prepare")


def test_jsonl_holds_the_documents_hpctrain_reads_from_text(tmp_path, monkeypatch):
    bench = _bench()
    monkeypatch.setattr("hpctrain.data.sources.PIECE_CHARS", 64)   # long paragraphs in pieces
    text = tmp_path / "t.txt.gz"
    long = "".join(f"line {i} of a long paragraph\n" for i in range(20))
    with gzip.open(text, "wt") as f:
        f.write(f"first para\nstill first\n\n  \n{long}\n\n\nthird ünïcode\n")
    jsonl = tmp_path / "c.jsonl"
    assert bench.write_jsonl([text], jsonl) == 3
    records = [json.loads(line)["text"] for line in jsonl.read_text().splitlines()]
    assert records == ["first para\nstill first\n", long, "third ünïcode\n"]
    prepare([text], tmp_path / "from_text")
    prepare([jsonl], tmp_path / "from_jsonl")
    for suffix in (".bin", ".idx"):
        assert filecmp.cmp(tmp_path / f"from_jsonl{suffix}", tmp_path / f"from_text{suffix}",
                           shallow=False) == (suffix == ".bin")
    # the .idx differs only because a text paragraph over PIECE_CHARS is several sequences


def test_missing_megatron_tree_is_one_error_line(tmp_path, capsys):
    bench = _bench()
    assert bench.main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: MEGATRON_LM: ")
    assert "tools/preprocess_data.py does not exist" in err[0]
