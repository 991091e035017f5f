"""The atomic writer (:mod:`ground.core.files`): whole files or nothing, no temporary file left."""

from __future__ import annotations

import errno

import pytest

from ground.core.files import write_atomically, write_text_atomically


def test_a_file_is_replaced_whole_and_its_directory_made(tmp_path):
    path = tmp_path / "new" / "memo.json"
    write_text_atomically(path, "first\n")
    write_text_atomically(path, "second\r\n")
    assert path.read_bytes() == b"second\r\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["memo.json"]


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, failure):
    path = tmp_path / "state.pt"
    path.write_text("old")

    def write_half_then_fail(temporary):
        temporary.write_text("half")
        raise failure

    with pytest.raises(type(failure)):
        write_atomically(path, write_half_then_fail)
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]
