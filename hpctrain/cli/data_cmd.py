"""``hpctrain data prepare``: text/JSONL files -> a Megatron indexed dataset (.bin/.idx)."""

from __future__ import annotations

import contextlib

import click

from .. import limits
from ..errors import UsageError
from ..file_door import printable, show
from .common import CheckedPath, echo_json, interactive, json_option


@click.group()
def data():
    """Prepare and inspect training data (Megatron's indexed .bin/.idx format).

    \b
    Example:
      hpctrain data prepare examples/corpus/kjv.txt.gz --output examples/data/kjv_byte
      hpctrain data info examples/data/kjv_byte
    """


@data.command("prepare")
@click.argument("files", nargs=-1, required=True, type=CheckedPath(dir_okay=False))
@click.option("--output", "-o", required=True, metavar="PREFIX", type=CheckedPath(),
              help="Output prefix: writes PREFIX.bin, PREFIX.idx (and PREFIX.meta.json).")
@click.option("--tokenizer", "-t", default="byte", show_default=True, metavar="byte|PATH",
              type=CheckedPath(),
              help="`byte` (built in, vocabulary 257), a local folder with tokenizer.json, a "
                   "SentencePiece .model or a tiktoken ranks file.")
@click.option("--json-key", default="text", show_default=True,
              help="Field of each JSONL record that holds the text.")
@click.option("--workers", "-j", default=1, show_default=True,
              type=limits.click_range("workers"),
              help="Tokenizer processes; the output bytes are the same for any count.")
@json_option
def prepare_cmd(files, output, tokenizer, json_key, workers, as_json):
    """Tokenize .txt/.jsonl files (optionally .gz) into Megatron's indexed format.

    \b
    A .txt document is a paragraph (lines up to a blank line); a JSONL document is
    one record. Every document ends with the tokenizer's end-of-document id.
    \b
    Example:
      hpctrain data prepare corpus/*.jsonl.gz --output data/corpus --tokenizer ./tokenizer
      hpctrain data prepare big.jsonl --output data/big -t ./tokenizer.model --workers 8
    """
    with _tokenizer_named_as_typed():
        stats = _prepare(files, output, tokenizer, json_key, workers, as_json)
    if as_json:
        echo_json(stats.__dict__)
        return
    docs = "document" if stats.documents == 1 else "documents"
    click.echo(f"Wrote {show(stats.output)}.bin/.idx: {stats.documents:,} {docs}, "
               f"{stats.tokens:,} tokens ({stats.dtype}, vocabulary {stats.vocab_size}) "
               f"in {stats.seconds:.1f}s")


def _prepare(files, output, tokenizer, json_key, workers, as_json):
    """``data.prepare.prepare``, with a progress bar when a person watches."""
    from ..data.prepare import prepare

    if interactive() and not as_json:
        with click.progressbar(length=1, label="Tokenizing", file=click.get_text_stream("stderr"),
                               show_pos=False, show_percent=True, show_eta=True) as bar:
            state = {"done": 0}

            def progress(done, total):
                bar.length = max(1, total)
                if done > state["done"]:
                    bar.update(done - state["done"])
                    state["done"] = done

            return prepare(files, output, tokenizer, json_key, progress, workers)
    return prepare(files, output, tokenizer, json_key, workers=workers)


@contextlib.contextmanager
def _tokenizer_named_as_typed():
    """The tokenizer's errors name the job field ``data.tokenizer`` (the data layer reads a
    job's tokenizer the same way); here the user typed ``--tokenizer``, and the error names
    that. The one place this command's tokenizer errors pass."""
    try:
        yield
    except UsageError as e:
        message = str(e)
        if not message.startswith(_FIELD):
            raise
        raise UsageError("--tokenizer" + message[len(_FIELD) - 1:]) from None


_FIELD = "data.tokenizer:"


@data.command("info")
@click.argument("prefix")
@json_option
def info_cmd(prefix, as_json):
    """Show the size of an indexed dataset.

    \b
    Example:
      hpctrain data info examples/data/kjv_byte
    """
    from ..data.indexed import IndexedDataset
    from ..data.prepare import read_meta

    ds = IndexedDataset(prefix)
    info = {"prefix": prefix, "documents": ds.num_documents, "sequences": len(ds),
            "tokens": ds.num_tokens, "dtype": ds.dtype.name, **{
                k: v for k, v in read_meta(prefix).items() if k in ("tokenizer", "vocab_size", "eod")}}
    if as_json:
        echo_json(info)
        return
    for k, v in info.items():   # the tokenizer's name is read from the sidecar on disk
        click.echo(printable(f"{k:10s} {v}"))
