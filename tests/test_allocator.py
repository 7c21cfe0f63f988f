"""A library leaves its host alone: importing suture changes no process-wide allocator state.

Each check runs in a fresh process, which counts glibc's malloc heaps (``malloc_info``) while
eight threads hold memory they allocated: one heap per thread means the host's own tuning
(glibc's default of up to 8 arenas per core) is intact; one heap in all means suture limited
the arenas, which it does only where it owns the process (the command line) or when asked.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

from suture._exec import memory

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(ctypes.CDLL("libc.so.6"), "malloc_info"),
    reason="malloc arenas and malloc_info are glibc's",
)

HEAP_COUNTER = """
import ctypes, json, sys, tempfile, threading

setup = sys.argv[1]
exec(setup)

libc = ctypes.CDLL("libc.so.6")
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
allocated = threading.Barrier(9)
counted = threading.Barrier(9)

def allocate():
    held = [bytearray(50_000) for _ in range(20)]  # malloc'd in this thread's arena
    allocated.wait(timeout=30)
    counted.wait(timeout=30)
    del held

threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
allocated.wait(timeout=30)
with tempfile.NamedTemporaryFile(suffix=".xml") as report:
    stream = libc.fopen(report.name.encode(), b"w")
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    heaps = open(report.name).read().count("<heap nr=")
counted.wait(timeout=30)
for thread in threads:
    thread.join(timeout=30)
print(json.dumps({"heaps": heaps}))
"""


def heaps_after(setup: str, **environment: str) -> int:
    """Malloc heaps in a fresh process that ran `setup`, then started eight allocating threads."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MALLOC_ARENA_MAX", "SUTURE_TUNE_ALLOCATOR")
    }
    env.update(environment)
    done = subprocess.run(
        [sys.executable, "-c", HEAP_COUNTER, setup],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["heaps"]


def test_eight_threads_get_heaps_of_their_own_without_suture() -> None:
    assert heaps_after("pass") >= 9


def test_importing_suture_leaves_the_allocator_alone() -> None:
    """After ``import suture`` (and its integrations and rules), threads the host starts get
    their own malloc heaps, as they would without suture."""
    setup = "import suture, suture.nnx, suture.rules, suture.optax, suture.linen"
    assert heaps_after(setup) >= 9


def test_the_command_line_tunes_the_process_it_owns() -> None:
    setup = (
        "import suture.cli\n"
        "try:\n"
        "    suture.cli.main(['--version'])\n"
        "except SystemExit:\n"
        "    pass\n"
    )
    assert heaps_after(setup) == 1


def test_the_environment_variable_tunes_the_whole_process() -> None:
    assert heaps_after("import suture", SUTURE_TUNE_ALLOCATOR="1") == 1


def test_a_save_asked_to_tune_tunes_the_process() -> None:
    """``save(tune_allocator=True)`` limits the arenas, and glibc keeps that limit for the rest of
    the process (documented): threads started afterwards share one heap."""
    setup = (
        "import numpy as np, suture, tempfile, os\n"
        "folder = tempfile.mkdtemp()\n"
        "suture.save({'w': np.ones((64, 64))}, os.path.join(folder, 'ckpt'), progress=False,\n"
        "            tune_allocator=True)\n"
    )
    assert heaps_after(setup) == 1


def test_a_save_not_asked_leaves_the_allocator_alone() -> None:
    setup = (
        "import numpy as np, suture, tempfile, os\n"
        "folder = tempfile.mkdtemp()\n"
        "suture.save({'w': np.ones((64, 64))}, os.path.join(folder, 'ckpt'), progress=False)\n"
    )
    assert heaps_after(setup) >= 9


def test_the_tuning_fixes_the_thresholds_unless_the_environment_sets_them(monkeypatch) -> None:
    calls: list[tuple[int, int]] = []

    class FakeLibc:
        def mallopt(self, option: int, value: int) -> int:
            calls.append((option, value))
            return 1

    monkeypatch.setattr(memory, "_LIBC", FakeLibc())
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")
    memory.tune_malloc()
    assert calls == [(-8, 1), (-3, 32 << 20)]  # one arena, the mmap threshold; trim left alone
