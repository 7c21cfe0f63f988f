"""Checkpoints served by a plain range-capable file server: ``python -m RangeHTTPServer``.

That server (PyPI's ``rangehttpserver``, the kind people put in front of a folder) answers
a folder named without its slash with ``301 -> folder/`` to ``HEAD`` but ``404`` to a
ranged ``GET`` (it opens the folder as a file), and a folder with its slash with an HTML
listing. Suture probes a folder's own name along with its files (`probe_ahead`); none of
these answers may stop an Orbax or a Hugging Face folder whose files answer from opening.
The server runs in a process of its own on 127.0.0.1, stopped at the end; every wait is
bounded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

import suture
from suture.cli import app
from tests.remote_servers import Hostile, free_port

runner = CliRunner()
TREE = {
    "params": {
        "w": np.arange(12.0, dtype=np.float32).reshape(3, 4),
        "b": np.linspace(-1, 1, 5, dtype=np.float32),
    }
}
HF = {
    "model.embed_tokens.weight": np.arange(24.0, dtype=np.float32).reshape(6, 4),
    "model.norm.weight": np.full(4, 0.5, np.float32),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An Orbax folder (``ckpt``) and a Hugging Face folder (``hf``) served by
    ``python -m RangeHTTPServer`` from a folder of their own; yields the server's URL."""
    pytest.importorskip("RangeHTTPServer")  # rangehttpserver, in the test extra
    root = tmp_path_factory.mktemp("plain-server")
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(root / "ckpt", TREE)
    (root / "hf").mkdir()
    save_file(HF, root / "hf" / "model.safetensors")
    (root / "hf" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (root / "my model").mkdir()  # a name with a space, and shards behind an index
    index = {"metadata": {}, "weight_map": {}}
    for number, (name, value) in enumerate(HF.items(), start=1):
        shard = f"model-0000{number}-of-00002.safetensors"
        save_file({name: value}, root / "my model" / shard)
        index["weight_map"][name] = shard
    (root / "my model" / "model.safetensors.index.json").write_text(json.dumps(index))
    (root / "with space").mkdir()  # both kinds under a folder named with a space
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(root / "with space" / "ckpt", TREE)
    shutil.copytree(root / "hf", root / "with space" / "hf")
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "RangeHTTPServer", str(port), "--bind", "127.0.0.1"],
        cwd=root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("RangeHTTPServer did not start within 20 s") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.mark.parametrize("slash", ["", "/"])
def test_an_orbax_folder_opens_from_a_plain_file_server(served: str, slash: str) -> None:
    url = f"{served}/ckpt{slash}"
    checkpoint = suture.open(url)
    assert checkpoint.format == "orbax"
    for name, expected in TREE["params"].items():
        np.testing.assert_array_equal(checkpoint[f"params/{name}"].read(), expected)
    loaded = suture.load(url)
    np.testing.assert_array_equal(loaded["params"]["w"], TREE["params"]["w"])
    np.testing.assert_array_equal(loaded["params"]["b"], TREE["params"]["b"])
    shown = runner.invoke(app, ["inspect", url])
    assert shown.exit_code == 0, shown.output
    assert "(orbax)" in shown.output and "(3, 4)" in shown.output
    assert "301" not in shown.output


@pytest.mark.parametrize("slash", ["", "/"])
def test_a_hugging_face_folder_opens_from_a_plain_file_server(served: str, slash: str) -> None:
    url = f"{served}/hf{slash}"
    checkpoint = suture.open(url)
    assert checkpoint.format == "safetensors"
    for name, expected in HF.items():
        np.testing.assert_array_equal(checkpoint[name.replace(".", "/")].read(), expected)
    loaded = suture.load(url)
    np.testing.assert_array_equal(
        loaded["model"]["embed_tokens"]["weight"], HF["model.embed_tokens.weight"]
    )
    shown = runner.invoke(app, ["inspect", url])
    assert shown.exit_code == 0, shown.output
    assert "(safetensors)" in shown.output and "(6, 4)" in shown.output


def test_an_index_in_a_folder_named_with_a_space_opens(served: str) -> None:
    for url in (f"{served}/my model", f"{served}/my model/model.safetensors.index.json"):
        checkpoint = suture.open(url)
        for name, expected in HF.items():
            np.testing.assert_array_equal(checkpoint[name.replace(".", "/")].read(), expected)


def test_a_conversion_reads_from_a_plain_file_server(served: str, tmp_path: Path) -> None:
    """Orbax on the server -> a local safetensors file, and the Hugging Face folder -> a
    local Orbax checkpoint, the values exact (an HTTP folder cannot be listed: no side
    files come along)."""
    done = runner.invoke(app, ["convert", f"{served}/ckpt", str(tmp_path / "out.safetensors")])
    assert done.exit_code == 0, done.output
    written = load_file(tmp_path / "out.safetensors")
    for name, expected in TREE["params"].items():
        np.testing.assert_array_equal(written[f"params.{name}"], expected)
    suture.convert(f"{served}/hf/", tmp_path / "orbax")
    back = suture.open(tmp_path / "orbax")
    for name, expected in HF.items():
        np.testing.assert_array_equal(back[name.replace(".", "/")].read(), expected)


def test_a_missing_folder_on_a_plain_file_server_is_an_error(served: str) -> None:
    with pytest.raises(suture.SurgeryError, match=r"nothere' is not a file on the HTTP server"):
        suture.open(f"{served}/nothere")
    shown = runner.invoke(app, ["inspect", f"{served}/nothere/"])
    assert shown.exit_code == 2 and "nothere" in shown.output and "Traceback" not in shown.output


# --- names that a URL percent-encodes ---------------------------------------------------


@pytest.mark.parametrize("slash", ["", "/"])
@pytest.mark.parametrize("folder", ["with%20space", "with space"])
@pytest.mark.parametrize("kind", ["ckpt", "hf"])
def test_a_folder_named_with_a_space_opens_as_pasted_or_typed(
    served: str, folder: str, kind: str, slash: str
) -> None:
    """A URL's path is percent-decoded once into the file's name, and every request (the
    driver's, the capped read, the redirect probe) encodes it once: ``with%20space`` (as a
    browser or a copied link gives it) and ``with space`` name the same folder."""
    url = f"{served}/{folder}/{kind}{slash}"
    checkpoint = suture.open(url)
    if kind == "ckpt":
        assert checkpoint.format == "orbax"
        np.testing.assert_array_equal(checkpoint["params/w"].read(), TREE["params"]["w"])
    else:
        assert checkpoint.format == "safetensors"
        np.testing.assert_array_equal(
            checkpoint["model/norm/weight"].read(), HF["model.norm.weight"]
        )
    shown = runner.invoke(app, ["inspect", url])
    assert shown.exit_code == 0, shown.output
    assert ("(3, 4)" if kind == "ckpt" else "(6, 4)") in shown.output


def test_a_missing_name_with_a_space_is_shown_encoded_once(served: str) -> None:
    """Messages show the URL as typed, or encoded once: never ``%2520``."""
    for url in (f"{served}/with%20space/nothere", f"{served}/with space/nothere/"):
        with pytest.raises(suture.SurgeryError, match=r"with%20space/nothere'") as error:
            suture.open(url)
        assert "%25" not in str(error.value)
        shown = runner.invoke(app, ["inspect", url])
        assert shown.exit_code == 2 and "with%20space/nothere" in shown.output
        assert "%25" not in shown.output and "Traceback" not in shown.output


def test_a_literal_percent_and_question_mark_in_a_name_are_written_encoded(
    http, tmp_path: Path
) -> None:
    """A '%' in a file's name is ``%25`` in its URL, a '?' ``%3F``, as in any URL; a name
    given raw (a '?' not encoded) is still taken as the name. Redirects to such names, and
    from them, are followed with the name encoded once (the probe sent it raw: 'Cannot
    reach')."""
    folder = f"odd-{tmp_path.name}"
    save_file(HF, tmp_path / "m.safetensors")
    http.publish(tmp_path / "m.safetensors", f"{folder}/100% sure?.safetensors")
    encoded = f"{http.url}/{folder}/100%25%20sure%3F.safetensors"
    moved = f"/{folder}/old%20name%3F.safetensors"
    http.hostile[moved] = Hostile(redirect=f"/{folder}/100%25%20sure%3F.safetensors")
    try:
        for url in (encoded, f"{http.url}/{folder}/100%25 sure?.safetensors", http.url + moved):
            checkpoint = suture.open(url)
            np.testing.assert_array_equal(
                checkpoint["model/norm/weight"].read(), HF["model.norm.weight"]
            )
        shown = runner.invoke(app, ["inspect", http.url + moved.replace("%20", " ")])
        assert shown.exit_code == 0, shown.output
    finally:
        del http.hostile[moved]


# --- a folder's own URL answering otherwise: a listing page, a refusal ------------------


@pytest.fixture
def folders(http, tmp_path: Path) -> Iterator[str]:
    """The Orbax and HF folders on the test's own range server (`tests/remote_servers.py`),
    under a prefix of their own; the hostile answers set by a test are removed after it."""
    prefix = f"own-url-{os.getpid()}-{tmp_path.name}"
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "ckpt", TREE)
    (tmp_path / "hf").mkdir()
    save_file(HF, tmp_path / "hf" / "model.safetensors")
    http.publish(tmp_path / "ckpt", f"{prefix}/ckpt")
    http.publish(tmp_path / "hf", f"{prefix}/hf")
    yield prefix
    for name in ("ckpt", "hf"):
        http.hostile.pop(f"/{prefix}/{name}", None)


LISTING = b"<!DOCTYPE HTML>\n<html><body><ul><li><a href='_METADATA'>_METADATA</a></li></ul>"


@pytest.mark.parametrize(
    "answer",
    [Hostile(body=LISTING), Hostile(redirect="/elsewhere/"), Hostile(status=403)],
    ids=["listing page", "redirect elsewhere", "refused"],
)
def test_a_folder_whose_own_url_answers_otherwise_still_opens(http, folders: str, answer) -> None:
    """A server that answers the folder's own URL with a page (200), a redirect to some
    other folder, or a refusal: the folder's files answer, so it is a folder."""
    for name in ("ckpt", "hf"):
        http.hostile[f"/{folders}/{name}"] = dataclasses.replace(answer)
    checkpoint = suture.open(f"{http.url}/{folders}/ckpt")
    np.testing.assert_array_equal(checkpoint["params/w"].read(), TREE["params"]["w"])
    hf = suture.open(f"{http.url}/{folders}/hf")
    np.testing.assert_array_equal(hf["model/norm/weight"].read(), HF["model.norm.weight"])
    for name in ("ckpt", "hf"):
        shown = runner.invoke(app, ["inspect", f"{http.url}/{folders}/{name}"])
        assert shown.exit_code == 0, shown.output


def test_a_refused_url_that_is_no_folder_is_still_an_error(http, folders: str) -> None:
    """The folder rule does not hide a real refusal: no folder file answers there."""
    http.hostile[f"/{folders}/secret"] = Hostile(status=403)
    try:
        with pytest.raises(suture.SurgeryError, match=r"HTTP 403 Forbidden"):
            suture.open(f"{http.url}/{folders}/secret")
        shown = runner.invoke(app, ["inspect", f"{http.url}/{folders}/secret"])
        assert shown.exit_code == 2 and "HTTP 403 Forbidden" in shown.output
    finally:
        del http.hostile[f"/{folders}/secret"]
