"""What is already at an output path is never replaced unless it is a regular file (issue 42): the one atomic writer
(inferlab.files) by its rule, and every command that takes an output path given a FIFO and, as root, a
private character device. Every path here is under the test's own temporary folder: no device of the machine's
is ever an output (a FIFO or a device node of the test's own stands in for /dev/null)."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from inferlab import files as outputs
from inferlab.files import OutputPathError, write_bytes_atomic, write_text_atomic

from fixture_runs import runs, shared  # noqa: F401 (runs is a fixture)
from shared_runs import inferlab_command

honest = shared("honest", "honest", "A complete, honest stand-in run; shared: never change it.")

CHARACTER_NULL = os.makedev(1, 3)  # Linux's numbers for the null device: the test's own node of it


@contextlib.contextmanager
def fifo(path: Path):
    """A FIFO at path read on a thread of its own (a writer's open waits for a reader): yields a list that holds
    what was read once the block ends; a reader still waiting (nothing opened the FIFO) is released then."""
    os.mkfifo(path)
    read = []
    thread = threading.Thread(target=lambda: read.append(path.read_bytes()), daemon=True)
    thread.start()
    try:
        yield read
    finally:
        thread.join(timeout=0.5)
        if thread.is_alive():
            with contextlib.suppress(OSError):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            thread.join(timeout=10)
        assert not thread.is_alive(), f"the reader of {path} never finished"


def private_null(folder: Path) -> Path:
    """A character device node like /dev/null under the test's folder; skipped where this process cannot make
    one (not root, or a container that forbids mknod)."""
    if os.geteuid() != 0:
        pytest.skip("making a character device needs root (CI runs as root)")
    node = folder / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, CHARACTER_NULL)
    except OSError as error:
        pytest.skip(f"mknod refused here: {error.strerror} ({errno.errorcode.get(error.errno)})")
    return node


def kind(path: Path) -> str:
    return outputs.kind_in_words(os.lstat(path).st_mode)


def unix_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))  # the socket's file outlives it


def test_a_new_file_is_made_whole_and_a_regular_file_or_a_link_to_it_is_replaced_keeping_its_mode_only_if_replace(
        tmp_path):
    target = tmp_path / "deep" / "page.md"
    write_text_atomic(target, "one\n")
    assert target.read_text() == "one\n"
    target.chmod(0o640)
    inode = target.stat().st_ino
    write_text_atomic(target, "two\n")
    assert target.read_text() == "two\n" and target.stat().st_ino != inode  # a new file, moved into place
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    with pytest.raises(OutputPathError, match=r"page\.md: already exists \(a regular file\)"):
        write_text_atomic(target, "three\n", replace=False)
    assert target.read_text() == "two\n"
    (target.parent / "link.md").symlink_to(target)  # followed, and it stays a link
    write_text_atomic(target.parent / "link.md", "new\n")
    assert (target.parent / "link.md").is_symlink() and target.read_text() == "new\n"
    with pytest.raises(OutputPathError, match="already exists"):
        write_text_atomic(target.parent / "link.md", "newer\n", replace=False)
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["link.md", "page.md"]  # no temporary left beside it


@pytest.mark.parametrize("name, replace", [("pipe", False), ("link", True)], ids=["only-new-files", "via-a-link"])
def test_a_fifo_is_written_through_never_replaced_even_where_only_new_files_are_written(tmp_path, name, replace):
    (tmp_path / "link").symlink_to(tmp_path / "pipe")
    with fifo(tmp_path / "pipe") as read:
        write_bytes_atomic(tmp_path / name, b"\x00" * 200_000, replace=replace)  # more than a pipe's buffer
    assert read == [b"\x00" * 200_000] and kind(tmp_path / "pipe") == "a FIFO (named pipe)"
    assert (tmp_path / "link").is_symlink() and sorted(p.name for p in tmp_path.iterdir()) == ["link", "pipe"]


def test_a_private_character_device_is_written_through(tmp_path):
    node = private_null(tmp_path)
    write_text_atomic(node, "discarded\n")
    write_text_atomic(node, "again\n", replace=False)
    assert kind(node) == "a character device" and os.lstat(node).st_rdev == CHARACTER_NULL


def test_a_descriptor_link_to_a_regular_file_is_appended_to_not_replaced(tmp_path):
    """/dev/stdout redirected to a file by the shell: the file the descriptor holds gets the bytes after what it
    already has, and stays the same file (replacing it would leave the descriptor on a deleted one)."""
    held = tmp_path / "held.txt"
    with open(held, "w") as handle:
        handle.write("before\n")
        handle.flush()
        descriptor_path = Path(f"/proc/self/fd/{handle.fileno()}")
        if not descriptor_path.exists():
            pytest.skip("no /proc/self/fd here")
        inode = held.stat().st_ino
        write_text_atomic(descriptor_path, "after\n")
    assert held.read_text() == "before\nafter\n" and held.stat().st_ino == inode


@pytest.mark.parametrize("folder", ["/dev/fd", "/proc/self/fd"])
def test_a_descriptor_link_to_a_pipe_is_written_through(folder):
    """/dev/stdout when the output is piped (`grade --out /dev/stdout | less`): the link's text names no file
    (pipe:[N]), and the kernel's own lookup, not the text, decides."""
    if not Path(folder).is_dir():
        pytest.skip(f"no {folder} here")
    read_end, write_end = os.pipe()
    try:
        write_text_atomic(Path(folder) / str(write_end), "through the pipe\n")
        assert os.read(read_end, 100) == b"through the pipe\n"
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_closed_descriptor_is_refused_and_another_path_under_proc_is_an_ordinary_path():
    """Only /proc/PID/fd/N and /dev/fd/N are descriptor links: another path under /proc is judged as any path is
    (absent: a new file would be made), never as a closed descriptor. Only looked at: nothing is written there."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    os.close(write_end)
    with pytest.raises(OutputPathError, match="names a file descriptor that is not open"):
        write_text_atomic(Path("/proc/self/fd") / str(write_end), "x")
    path = Path("/proc/inferlab-no-such-folder/out.txt")
    assert outputs.output_kind(path) == (outputs.ABSENT, path)


@pytest.mark.parametrize("make, words", [
    (lambda p: p.mkdir(), "is a directory: nothing is written there; name a file inside it"),
    (lambda p: p.symlink_to(p.parent / "nowhere"), "a symbolic link to .*nowhere, where nothing is"),
    (lambda p: p.symlink_to(p), "more than 40 symbolic links"),
    (unix_socket, "target is a socket: nothing is written there"),
], ids=["directory", "dangling-link", "link-loop", "socket"])
def test_what_cannot_be_written_through_is_refused_and_left_as_it_was(tmp_path, make, words):
    target = tmp_path / "target"
    make(target)
    before = os.lstat(target)
    with pytest.raises(OutputPathError, match=words):
        write_text_atomic(target, "x")
    assert os.lstat(target).st_mode == before.st_mode and not (tmp_path / "nowhere").exists()


def test_one_definition_of_each_atomic_writer():
    package = Path(outputs.__file__).resolve().parent
    found = [f"{path.relative_to(package)}: {line.strip()}"
             for path in sorted(package.rglob("*.py"))
             for line in path.read_text().splitlines()
             if line.startswith(("def write_text_atomic", "def write_bytes_atomic"))]
    assert found == ["files.py: def write_bytes_atomic(path, data: bytes, replace: bool = True) -> None:",
                     "files.py: def write_text_atomic(path, text: str, replace: bool = True) -> None:"]


def commands(run: Path, target: Path) -> dict:
    """Each command line that writes to an output path, with `target` as that path."""
    return {
        "grade --out": ["grade", run, "--format", "json", "--out", target],
        "grade --csv": ["grade", run, "--csv", target],
        "pack -o": ["pack", run, "-o", target],
        "autograder -o": ["autograder", "gradescope", "-o", target],
    }


COMMANDS = list(commands(Path(), Path()))
# the first bytes each writes: a JSON grade, a CSV header, a gzip archive, a zip
STARTS = {"grade --out": b"{", "grade --csv": b"learner,source,", "pack -o": b"\x1f\x8b", "autograder -o": b"PK"}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_writes_through_a_fifo_and_a_device_and_replaces_a_file_only_with_replace_never_a_directory(
        honest, tmp_path, command, capsys):
    with fifo(tmp_path / "pipe") as read:
        status, _ = inferlab_command(*commands(honest, tmp_path / "pipe")[command])
    assert status in (0, 1), capsys.readouterr().err
    assert read[0].startswith(STARTS[command]) and kind(tmp_path / "pipe") == "a FIFO (named pipe)", read[0][:80]
    (tmp_path / "folder").mkdir()
    status, _ = inferlab_command(*commands(honest, tmp_path / "folder")[command])
    said = capsys.readouterr().err
    assert status == 2 and f"{tmp_path / 'folder'} is a directory" in said and "--replace" not in said  # never lifts
    assert list((tmp_path / "folder").iterdir()) == []
    target = tmp_path / "there.tar.gz"
    target.write_bytes(b"kept")
    status, _ = inferlab_command(*commands(honest, target)[command])
    said = capsys.readouterr().err
    assert status == 2 and f"{target}: already exists" in said and said.rstrip().endswith("(or give --replace)")
    assert target.read_bytes() == b"kept"
    status, _ = inferlab_command(*commands(honest, target)[command], "--replace")
    assert status in (0, 1) and target.read_bytes().startswith(STARTS[command])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "pipe", "there.tar.gz"]  # no temporary file left
    node = private_null(tmp_path)  # last: skipped where this process cannot make one
    status, _ = inferlab_command(*commands(honest, node)[command])
    assert status in (0, 1), capsys.readouterr().err
    assert kind(node) == "a character device" and os.lstat(node).st_rdev == CHARACTER_NULL
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "null", "pipe", "there.tar.gz"]


@pytest.mark.process
def test_grade_out_dev_stdout_redirected_to_a_file_keeps_the_json_and_the_page_in_order(honest, tmp_path):
    """`grade RUN --format json --out /dev/stdout > FILE`: the shell opens FILE without O_APPEND, so bytes written
    through a new opening of /dev/stdout would start at offset 0 and the page printed after them would overwrite
    them; written through the process's own descriptor, the JSON comes first and the page after it, whole."""
    out = tmp_path / "both.txt"
    code = "import sys; from inferlab.__main__ import main; sys.exit(main(sys.argv[1:]))"
    with open(out, "w") as handle:
        done = subprocess.run([sys.executable, "-c", code, "grade", str(honest), "--format", "json", "--out",
                               "/dev/stdout"], stdout=handle, stderr=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert done.returncode != 2, done.stderr  # the verdict is not what this test is about: where the bytes go is
    text = out.read_text()
    assert text.startswith("{\n") and '"grades"' in text, text[:200]
    json_end = text.index("\n}\n") + 3
    assert text[json_end:].startswith("grade: "), text[json_end:json_end + 200]
