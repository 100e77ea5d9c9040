"""The checkpoint writer's results queue: pickles pass only through a private folder."""

from __future__ import annotations

import os
import pickle
import queue

import pytest

from hpctrain.runtime.checkpoint.results_queue import FileResultsQueue


class Planted:
    """Unpickling this runs code: what a planted pickle would do."""

    def __reduce__(self):
        return (os.mkdir, (os.environ["PLANTED_MARK"],))


def test_results_pass_through_a_fresh_private_folder_that_is_gone_once_read(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    q = FileResultsQueue()
    with pytest.raises(queue.Empty):
        q.get_nowait()
    q.prepare()                                     # in the rank, before the writer forks
    first = q.folder
    assert first.parent == tmp_path and first.name.startswith("hpctrain-write-results-")
    st = first.stat()
    assert st.st_mode & 0o777 == 0o700 and st.st_uid == os.geteuid()
    pid = os.fork()
    if pid == 0:                                    # the writer: a forked process, as megatron's
        q.put({"rank": 0, "results": [1, 2, 3]})
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert q.get_nowait() == {"rank": 0, "results": [1, 2, 3]}
    assert not first.exists() and q.folder is None  # nothing left between saves
    q.prepare()
    assert q.folder != first and q.folder.is_dir()  # every save: a new unpredictable name
    q.remove()
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("loosen", ["group-writable", "symlink"])
def test_a_folder_others_could_write_is_refused_before_anything_is_unpickled(tmp_path, monkeypatch,
                                                                           loosen):
    mark = tmp_path / "code-ran"
    monkeypatch.setenv("PLANTED_MARK", str(mark))
    q = FileResultsQueue()
    q.prepare()
    real = q.folder
    (real / "00000000000000000001-1.pkl").write_bytes(pickle.dumps(Planted()))
    if loosen == "group-writable":
        os.chmod(real, 0o770)
    else:
        link = tmp_path / "link"
        link.symlink_to(real)
        q.folder = link
    with pytest.raises(RuntimeError, match="not a private folder of this user"):
        q.get_nowait()
    with pytest.raises(RuntimeError, match="not a private folder of this user"):
        q.put({"x": 1})
    assert not mark.exists()
    os.chmod(real, 0o700)
    q.folder = real
    q.remove()
