"""Destinations an unlucky user points suture at: nothing there is lost, nothing leaks.

`--overwrite` replaces only what suture itself writes (a checkpoint and its side files),
locally and on object stores; an unfinished save that is not a dead suture writer's is
somebody's work in progress and is left alone; a lock is never followed through a link
nor read unless it is suture's own; a lock whose pid was reused is stale; an output
inside a source folder is refused.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import suture
from suture._location import location_of
from suture._location.publish import exclusive, lock_of


def _cli(*arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "suture", *arguments]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


def _refused(result: subprocess.CompletedProcess, message: str) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("Error: ") and "Traceback" not in result.stderr, result.stderr
    assert message in result.stderr, result.stderr


def _project(folder: Path) -> None:
    """A project folder that happens to hold one safetensors file."""
    (folder / ".git").mkdir(parents=True)
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "src").mkdir()
    (folder / "src" / "train.py").write_text("print('years of work')\n")
    save_file({"w": np.zeros(2, np.float32)}, folder / "model.safetensors")


def test_overwrite_refuses_a_project_folder_naming_the_first_foreign_entry(tmp_path: Path) -> None:
    """Item 1: the folder counts as a checkpoint, but .git and src are not suture's to delete."""
    save_file({"w": np.ones(2, np.float32)}, tmp_path / "s.safetensors")
    _project(tmp_path / "proj")
    result = _cli("convert", "s.safetensors", "proj", "--overwrite", cwd=tmp_path)
    _refused(result, "also holds '.git/HEAD', which suture did not write")
    assert (tmp_path / "proj" / "src" / "train.py").read_text() == "print('years of work')\n"
    assert (tmp_path / "proj" / ".git" / "HEAD").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proj", "s.safetensors"]


def test_overwrite_still_replaces_a_model_folder_with_its_side_files(tmp_path: Path) -> None:
    save_file({"w": np.ones(2, np.float32)}, tmp_path / "s.safetensors")
    old = tmp_path / "model"
    old.mkdir()
    save_file({"w": np.zeros(2, np.float32)}, old / "model.safetensors")
    for name in ("config.json", "tokenizer.json", "generation_config.json", "README.md"):
        (old / name).write_text("{}")
    (old / "1_Pooling").mkdir()
    (old / "1_Pooling" / "config.json").write_text("{}")
    result = _cli("convert", "s.safetensors", "model", "--overwrite", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert float(suture.open(old)["w"].read().sum()) == 2.0


def test_overwrite_replaces_orbax_checkpoints_and_manager_steps(tmp_path: Path) -> None:
    """Everything Orbax writes (OCDBT or not, a CheckpointManager step) is replaceable."""
    import orbax.checkpoint as ocp

    tree = {"a": {"w": np.ones((4, 4), np.float32)}, "b": np.arange(3)}
    checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False))
    checkpointer.save((tmp_path / "plain").absolute(), tree)
    with ocp.CheckpointManager((tmp_path / "run").absolute(), item_names=("model",)) as manager:
        manager.save(3, args=ocp.args.Composite(model=ocp.args.StandardSave(tree)))
        manager.wait_until_finished()
    for destination in (tmp_path / "plain", tmp_path / "run" / "3"):
        suture.save({"w": np.full(2, 7.0)}, destination, overwrite=True, progress=False)
        assert float(suture.open(destination)["w"].read()[0]) == 7.0


def test_overwrite_refuses_foreign_objects_under_an_s3_prefix(s3: str, tmp_path: Path) -> None:
    """Item 2: the local rule on every object store: data/notes.txt is not suture's."""
    url = f"{s3}/overwrite-foreign/data"
    suture.save({"w": np.zeros(2, np.float32)}, url, progress=False)
    location_of(f"{url}/notes.txt").write_bytes(b"years of work")
    location_of(f"{url}/sub/results.csv").write_bytes(b"a,b\n1,2\n")
    with pytest.raises(suture.DestinationError, match=r"also holds 'notes.txt'"):
        suture.save({"w": np.ones(2, np.float32)}, url, overwrite=True, progress=False)
    assert location_of(f"{url}/notes.txt").read_bytes() == b"years of work"
    assert location_of(f"{url}/sub/results.csv").is_file()
    assert float(suture.open(url)["w"].read().sum()) == 0.0  # the old checkpoint is intact


def test_overwrite_refuses_a_prefix_that_is_not_a_checkpoint(gcs: str) -> None:
    url = f"{gcs}/overwrite-plain/data"
    location_of(f"{url}/notes.txt").write_bytes(b"years of work")
    with pytest.raises(suture.DestinationError, match="is not one that suture recognizes"):
        suture.save({"w": np.ones(2, np.float32)}, url, overwrite=True, progress=False)
    assert location_of(f"{url}/notes.txt").read_bytes() == b"years of work"


def test_overwrite_still_replaces_a_remote_checkpoint(s3: str, gcs: str) -> None:
    for base in (s3, gcs):
        url = f"{base}/overwrite-ok/ckpt"
        suture.save({"w": np.zeros(2, np.float32)}, url, progress=False)
        suture.save({"w": np.ones(2, np.float32)}, url, overwrite=True, progress=False)
        assert float(suture.open(url)["w"].read().sum()) == 2.0


def _orbax_save_in_progress(url: str) -> None:
    """What another host's Orbax save looks like halfway: metadata without a commit, data."""
    started = time.time_ns()
    metadata = {"item_handlers": None, "metrics": {}, "performance_metrics": {}}
    metadata |= {"init_timestamp_nsecs": started, "commit_timestamp_nsecs": None}
    location_of(f"{url}/_CHECKPOINT_METADATA").write_bytes(json.dumps(metadata).encode())
    location_of(f"{url}/ocdbt.process_1/manifest.ocdbt").write_bytes(b"another host's data")


def test_an_unfinished_prefix_without_a_suture_lock_is_left_alone(s3: str, tmp_path: Path) -> None:
    """Item 3: another host's save in progress is not a dead writer's leftovers."""
    url = f"{s3}/in-progress/run"
    _orbax_save_in_progress(url)
    with pytest.raises(suture.DestinationError, match="holds an unfinished checkpoint that is not"):
        suture.save({"w": np.ones(2, np.float32)}, url, progress=False)
    message = ""
    try:
        suture.save({"w": np.ones(2, np.float32)}, url, progress=False)
    except suture.DestinationError as error:
        message = str(error)
    assert "an Orbax save started at" in message and "--overwrite" in message
    assert (
        location_of(f"{url}/ocdbt.process_1/manifest.ocdbt").read_bytes() == b"another host's data"
    )
    # taking it over deliberately works
    suture.save({"w": np.ones(2, np.float32)}, url, overwrite=True, progress=False)
    assert float(suture.open(url)["w"].read().sum()) == 2.0
    assert not location_of(f"{url}/ocdbt.process_1/manifest.ocdbt").is_file()


def test_the_cli_leaves_an_unfinished_prefix_alone(s3: str, tmp_path: Path) -> None:
    url = f"{s3}/in-progress-cli/run"
    _orbax_save_in_progress(url)
    save_file({"w": np.ones(2, np.float32)}, tmp_path / "s.safetensors")
    result = _cli("convert", "s.safetensors", url, cwd=tmp_path)
    _refused(result, "not suture's own")
    assert location_of(f"{url}/_CHECKPOINT_METADATA").is_file()


def test_a_dead_suture_writer_of_this_prefix_is_still_taken_over(gcs: str) -> None:
    """The exception item 3 keeps: leftovers beside a stale suture lock of this host."""
    url = f"{gcs}/dead-writer/run"
    _orbax_save_in_progress(url)
    dead = _dead_pid()
    lock = lock_of(location_of(url))
    lock.write_bytes(f"{dead}@{socket.gethostname()} {uuid.uuid4().hex}".encode())
    with pytest.warns(suture.StaleLockWarning, match=f"pid {dead}"):
        suture.save({"w": np.ones(2, np.float32)}, url, progress=False)
    assert float(suture.open(url)["w"].read().sum()) == 2.0
    assert not location_of(f"{url}/ocdbt.process_1/manifest.ocdbt").is_file()
    assert not lock.is_file()


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_lock_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    """Item 8: nothing of the linked file reaches the message."""
    secret = tmp_path / "secret.txt"
    secret.write_text("4242@SECRETHOSTmarker 0123456789abcdef0123456789abcdef")
    destination = tmp_path / "out"
    os.symlink(secret, lock_of(location_of(destination)).path)
    with pytest.raises(suture.DestinationError) as caught:
        suture.save({"w": np.ones(2)}, destination, progress=False)
    assert "is not a lock suture wrote" in str(caught.value)
    assert "SECRETHOST" not in str(caught.value) and "4242" not in str(caught.value)
    assert secret.is_file() and not destination.exists()
    assert os.path.islink(lock_of(location_of(destination)).path)  # not removed either


@pytest.mark.parametrize(
    "content", [b"not a lock at all", b"4242@SECRETHOSTmarker secret", b"4242 pid", b"\xff" * 64]
)
def test_a_lock_of_other_content_is_foreign(tmp_path: Path, content: bytes) -> None:
    destination = tmp_path / "out"
    lock_of(location_of(destination)).path.write_bytes(content)
    with pytest.raises(suture.DestinationError, match="is not a lock suture wrote") as caught:
        suture.save({"w": np.ones(2)}, destination, progress=False)
    assert "SECRETHOST" not in str(caught.value) and "4242" not in str(caught.value)
    assert lock_of(location_of(destination)).path.read_bytes() == content


def test_a_lock_caught_between_its_creation_and_its_writing_is_another_writers(
    tmp_path: Path,
) -> None:
    """A writer creates its lock and then writes its name into it; a second writer starting
    that instant finds it empty. It waits for the name instead of calling the lock foreign."""
    destination = tmp_path / "out"
    lock = lock_of(location_of(destination)).path
    lock.write_bytes(b"")  # just created by the other writer (this process stands in for it)
    name = f"{os.getpid()}@{socket.gethostname()} {uuid.uuid4().hex}"
    writing = threading.Timer(0.05, lock.write_text, args=(name,))
    writing.start()
    try:
        with pytest.raises(
            suture.DestinationError, match=r"Another process \(pid \d+\) is writing"
        ):
            suture.save({"w": np.ones(2)}, destination, progress=False)
    finally:
        writing.join()
    assert lock.read_text() == name  # the other writer's lock is left alone


def test_a_stale_lock_whose_pid_was_reused_is_taken_over(tmp_path: Path) -> None:
    """Item 14: the writer was SIGKILLed; its pid now belongs to an unrelated process."""
    destination = tmp_path / "out"
    unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # the lock as the killed writer left it: the same pid, an earlier start time
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        lock = f"{unrelated.pid}@{socket.gethostname()} {uuid.uuid4().hex} start={boot}:1"
        lock_of(location_of(destination)).path.write_text(lock)
        with pytest.warns(suture.StaleLockWarning, match="now a different process"):
            suture.save({"w": np.ones(2)}, destination, progress=False)
        assert float(suture.open(destination)["w"].read().sum()) == 2.0
        assert not lock_of(location_of(destination)).path.exists()
        assert unrelated.poll() is None  # nothing was done to the unrelated process
    finally:
        unrelated.kill()
        unrelated.wait()


def test_a_lock_of_a_live_writer_still_keeps_others_out(tmp_path: Path) -> None:
    destination = location_of(tmp_path / "out")
    with exclusive(destination):
        text = lock_of(destination).path.read_text()
        assert f"{os.getpid()}@{socket.gethostname()} " in text and " start=" in text
        with pytest.raises(suture.DestinationError, match="Another process"):
            suture.save({"w": np.ones(2)}, tmp_path / "out", progress=False)
    assert not lock_of(destination).path.exists()


def test_a_killed_writer_leaves_a_lock_the_next_run_takes_over(tmp_path: Path) -> None:
    """A real SIGKILL: the next run goes ahead with a message, not a demand to clean up."""
    source = tmp_path / "s.safetensors"
    save_file({f"w{i}": np.ones((256, 1024), np.float32) for i in range(32)}, source)
    writer = subprocess.Popen(
        [sys.executable, "-m", "suture", "convert", str(source), "out", "--max-memory", "4MiB"],
        cwd=tmp_path,
        stderr=subprocess.DEVNULL,
    )
    lock = lock_of(location_of(tmp_path / "out")).path
    deadline = time.monotonic() + 60
    while not lock.exists() and writer.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    writer.kill()
    writer.wait()
    if not lock.exists():
        pytest.skip("the write finished before it could be killed")
    result = _cli("convert", str(source), "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Warning: Took over the lock" in result.stderr
    assert not lock.exists() and not list(tmp_path.glob(".out.suture-lock-*.draft"))


def test_a_lock_appears_with_its_writers_name_in_one_step(tmp_path: Path) -> None:
    """CI caught a SIGKILL between creating the lock and writing its name: the empty lock
    it left was nobody's, and the next run refused it as foreign. The name is now written to
    a draft that is linked into place, so a kill leaves a whole lock or none, and a draft
    left by a writer that is gone is removed by the next one."""
    destination = tmp_path / "out"
    lock = lock_of(location_of(destination)).path
    dead_draft = lock.with_name(f"{lock.name}-{uuid.uuid4().hex}.draft")
    dead_draft.write_text(f"{_dead_pid()}@{socket.gethostname()} {uuid.uuid4().hex}")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live_draft = lock.with_name(f"{lock.name}-{uuid.uuid4().hex}.draft")
        live_draft.write_text(f"{live.pid}@{socket.gethostname()} {uuid.uuid4().hex}")
        seen = []
        real_link = os.link

        def link_and_look(draft, target, **options):
            real_link(draft, target, **options)
            seen.append(Path(target).read_text())  # the lock as any reader first finds it

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(os, "link", link_and_look)
            suture.save({"w": np.ones(2)}, destination, progress=False)
        assert len(seen) == 1 and f"{os.getpid()}@{socket.gethostname()} " in seen[0]
        assert float(suture.open(destination)["w"].read().sum()) == 2.0
        assert not dead_draft.exists() and not lock.exists()
        assert live_draft.exists()  # a live writer's draft is its own business
    finally:
        live.kill()
        live.wait()


def test_a_filesystem_without_hard_links_still_gets_a_lock(tmp_path: Path) -> None:
    def no_links(*arguments, **options):
        raise PermissionError(1, "Operation not permitted")

    destination = tmp_path / "out"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "link", no_links)
        with exclusive(location_of(destination)):
            text = lock_of(location_of(destination)).path.read_text()
            assert text.startswith(f"{os.getpid()}@{socket.gethostname()} ")
    assert not lock_of(location_of(destination)).path.exists()
    assert not list(tmp_path.glob(".out.suture-lock-*.draft"))


# `suture ARGS` with Ctrl-C sent to itself at the instant its output is put in place (right
# after the rename, the commit marker or the last upload), the worst moment for the message
INTERRUPTED_AT_THE_COMMIT = """
import os, signal, sys
from suture._location import publish
from suture.cli import main

finished = publish.record_finished


def and_then_ctrl_c(output):
    finished(output)
    os.kill(os.getpid(), signal.SIGINT)


publish.record_finished = and_then_ctrl_c
main(sys.argv[1:])
"""


@pytest.mark.parametrize("where", ["local", "local-replaced", "gcs", "s3-staged"])
def test_ctrl_c_as_the_output_is_put_in_place_keeps_it_and_says_so(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    """It said "no output was written" of a finished output; on a bucket, where the save
    writes in place, its clean-up then deleted the finished checkpoint."""
    save_file({"w": np.arange(6, dtype=np.float32)}, tmp_path / "s.safetensors")
    if where.startswith("local"):
        out = str(tmp_path / "out")
        if where == "local-replaced":
            suture.save({"old": np.zeros(2)}, out, progress=False)
    else:
        bucket = request.getfixturevalue(where.split("-")[0])
        out = f"{bucket}/committed-{uuid.uuid4().hex[:8]}"
        out += ".safetensors" if where.endswith("staged") else ""
    extra = ["--overwrite"] if where == "local-replaced" else []
    staged_before = set(Path(tempfile.gettempdir()).glob("suture-upload-*"))
    ran = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_AT_THE_COMMIT, "convert", "s.safetensors", out]
        + [*extra, "--no-progress"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 130, ran.stderr
    assert "Traceback" not in ran.stderr, ran.stderr
    assert ran.stderr.strip().splitlines()[-1] == (
        f"Stopped by Ctrl-C (SIGINT) after {out!r} was written in full; it is kept."
    ), ran.stderr
    assert suture.open(out)["w"].read().tolist() == [0, 1, 2, 3, 4, 5]
    assert "old" not in suture.open(out)
    if where.startswith("local"):  # no temporary output, lock or replaced result is left
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "s.safetensors"]
    else:  # nor the local folder a staged upload was written in
        staging = Path(tempfile.gettempdir())
        assert staged_before == set(staging.glob("suture-upload-*")), "a staging folder is left"


@pytest.mark.parametrize("name", ["m.safetensors", "hf_folder"])
def test_a_failed_local_safetensors_save_leaves_its_folder_alone(tmp_path: Path, name: str) -> None:
    """A local safetensors save is written aside and renamed, with no upload staging: its
    clean-up once took the temporary output's parent for a staging folder and deleted the
    folder the output was going into, with everything in it (caught by CI before landing)."""
    (tmp_path / "precious.txt").write_text("years of work")
    with pytest.raises(suture.SurgeryError, match="metadata must map strings to strings"):
        suture.save(
            {"w": np.ones(2)}, tmp_path / name, format="safetensors", metadata={"a": 1},
            progress=False,
        )  # fmt: skip
    assert (tmp_path / "precious.txt").read_text() == "years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.txt"]


def test_an_output_inside_the_source_folder_is_refused(tmp_path: Path) -> None:
    """Item 15: hf/out.safetensors would become a second shard of hf."""
    (tmp_path / "hf").mkdir()
    save_file({"w": np.ones(2, np.float32)}, tmp_path / "hf" / "model.safetensors")
    (tmp_path / "hf" / "config.json").write_text("{}")
    result = _cli("convert", "hf", "hf/out.safetensors", cwd=tmp_path)
    _refused(result, "the checkpoint folder this save reads 'w' from")
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == [
        "config.json",
        "model.safetensors",
    ]
    assert float(suture.open(tmp_path / "hf")["w"].read().sum()) == 2.0
    # beside a single file (not a folder source) is where outputs usually go
    result = _cli("convert", "hf/model.safetensors", "hf/half.safetensors", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_an_output_inside_an_orbax_source_is_refused(tmp_path: Path) -> None:
    suture.save({"w": np.ones(2)}, tmp_path / "ckpt", progress=False)
    with pytest.raises(suture.DestinationError, match="inside"):
        suture.save(suture.open(tmp_path / "ckpt"), tmp_path / "ckpt" / "copy", progress=False)


# --- a destination that cannot be written (issue 37, item 14) -----------------------------


@pytest.fixture
def read_only_folder(tmp_path: Path):
    """A folder nobody can write in: a read-only tmpfs as root (root ignores modes), else a
    folder without write permission."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


@pytest.mark.parametrize(
    "arguments",
    [
        ["convert", "src", "read_only/out"],
        ["convert", "src", "read_only/out", "--format", "safetensors"],
        ["merge", "merge.yaml", "-o", "read_only/merged"],
        ["demo", "--examples", "read_only/examples"],
    ],
)
def test_a_read_only_destination_is_a_destination_error_naming_the_folder(
    tmp_path: Path, read_only_folder: Path, arguments: list[str]
) -> None:
    """It was a raw OSError traceback from creating the lock file."""
    suture.save({"w": np.arange(8, dtype=np.float32)}, tmp_path / "src", progress=False)
    (tmp_path / "merge.yaml").write_text("method: linear\nmodels: [src, src]\n")
    before = sorted(p.name for p in (tmp_path / "src").rglob("*"))
    result = _cli(*arguments, cwd=tmp_path)
    _refused(result, "read_only")
    assert "Read-only file system" in result.stderr or "Permission denied" in result.stderr
    assert "folder you can write" in result.stderr
    assert list(read_only_folder.iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "src").rglob("*")) == before


def test_saving_into_a_read_only_folder_raises_destination_error(
    tmp_path: Path, read_only_folder: Path
) -> None:
    tree = {"w": np.arange(8, dtype=np.float32)}
    with pytest.raises(suture.DestinationError, match=r"Cannot write in '.*read_only'"):
        suture.save(tree, read_only_folder / "out", progress=False)
    with pytest.raises(suture.DestinationError, match=r"Cannot write in '.*read_only'"):
        suture.save(tree, read_only_folder / "run", step=3, progress=False)
    assert list(read_only_folder.iterdir()) == []


def _without_root_overrides(arguments: list[str]) -> list[str]:
    """`arguments` run with file modes applying (root's override capabilities dropped), or a
    skip where that cannot be done here."""
    if os.geteuid() != 0:
        return arguments
    if subprocess.run(["setpriv", "--version"], capture_output=True).returncode != 0:
        pytest.skip("setpriv is not installed: root would ignore the modes")
    dropped = "-dac_override,-dac_read_search,-fowner"
    return ["setpriv", "--bounding-set", dropped, "--inh-caps", dropped, *arguments]


@pytest.mark.parametrize("format_", ["orbax", "safetensors"])
def test_overwriting_a_read_only_result_deletes_it_all(tmp_path: Path, format_: str) -> None:
    """The replaced result's folders had no write permission: it was left behind, silently,
    under a temporary name."""
    tree = {"w": np.arange(8, dtype=np.float32)}
    suture.save(tree, tmp_path / "src", progress=False)
    suture.save(tree, tmp_path / "out", format=format_, progress=False)
    for path in [tmp_path / "out", *(tmp_path / "out").rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)
    command = [sys.executable, "-m", "suture", "convert", "src", "out", "--format", format_]
    result = subprocess.run(
        _without_root_overrides([*command, "--overwrite"]),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src"]
    np.testing.assert_array_equal(suture.open(tmp_path / "out")["w"].read(), tree["w"])
