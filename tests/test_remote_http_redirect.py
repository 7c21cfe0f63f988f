"""HTTP folders as users type them: redirects followed within the same host, statuses worded.

The range server of tests/remote_servers.py answers a folder named without its slash with
``301 -> folder/`` (as ``http.server``, nginx and Apache do); `Hostile.redirect` answers a
path with ``302`` to anywhere, another server on 127.0.0.1 included (another port is
another host: refused).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from safetensors.numpy import save_file
from typer.testing import CliRunner

import suture
from suture.cli import app
from tests.remote_servers import Hostile, http_server

runner = CliRunner()


@pytest.fixture(scope="module")
def published(http, tmp_path_factory: pytest.TempPathFactory) -> str:
    """An Orbax checkpoint and a safetensors folder on the HTTP server; yields its URL."""
    root = tmp_path_factory.mktemp("redirects")
    tree = {"params": {"w": np.arange(12.0, dtype=np.float32).reshape(3, 4)}}
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(root / "ckpt", tree)
    (root / "hf").mkdir()
    save_file({"w": np.ones((2, 2), np.float32)}, root / "hf" / "model.safetensors")
    http.publish(root / "ckpt", "redirects/ckpt")
    http.publish(root / "hf", "redirects/hf")
    return f"{http.url}/redirects"


def test_a_folder_without_its_slash_opens(published: str) -> None:
    checkpoint = suture.open(f"{published}/ckpt")
    np.testing.assert_array_equal(checkpoint["params/w"].read(), np.arange(12.0).reshape(3, 4))
    np.testing.assert_array_equal(suture.open(f"{published}/hf")["w"].read(), np.ones((2, 2)))
    for url in (f"{published}/ckpt", f"{published}/ckpt/"):
        shown = runner.invoke(app, ["inspect", url])
        assert shown.exit_code == 0, shown.output
        assert "params" in shown.output and "(3, 4)" in shown.output


def test_a_file_moved_on_the_same_host_is_followed(published: str, http) -> None:
    http.hostile["/redirects/old.safetensors"] = Hostile(redirect="/redirects/hf/model.safetensors")
    moved = suture.open(f"{published}/old.safetensors")
    np.testing.assert_array_equal(moved["w"].read(), np.ones((2, 2)))


def test_a_moved_index_is_followed_and_read_whole(published: str, http, tmp_path: Path) -> None:
    """An index (metadata, read whole under the size cap) moved on the same host."""
    index = {"metadata": {}, "weight_map": {"w": "model.safetensors"}}
    (http.root / "redirects" / "hf" / "model.safetensors.index.json").write_text(json.dumps(index))
    http.hostile["/redirects/hf/old.safetensors.index.json"] = Hostile(
        redirect="/redirects/hf/model.safetensors.index.json"
    )
    try:
        moved = suture.open(f"{published}/hf/old.safetensors.index.json")
    finally:
        del http.hostile["/redirects/hf/old.safetensors.index.json"]
        (http.root / "redirects" / "hf" / "model.safetensors.index.json").unlink()
    np.testing.assert_array_equal(moved["w"].read(), np.ones((2, 2)))


def test_a_redirect_to_another_host_is_refused(published: str, http, tmp_path: Path) -> None:
    with http_server(tmp_path) as elsewhere:
        save_file({"w": np.zeros(2, np.float32)}, tmp_path / "model.safetensors")
        http.hostile["/redirects/away.safetensors"] = Hostile(
            redirect=f"{elsewhere.url}/model.safetensors"
        )
        with pytest.raises(suture.SurgeryError, match=r"redirects \(HTTP 302 Found\) to 'http://"):
            suture.open(f"{published}/away.safetensors")
        shown = runner.invoke(app, ["inspect", f"{published}/away.safetensors"])
        assert shown.exit_code == 2
        assert "on another host: suture follows redirects within the same host only" in (
            shown.output
        )
        assert elsewhere.bytes_sent == 0  # not a byte asked of the other server
    http.hostile["/redirects/tls.safetensors"] = Hostile(
        redirect=f"https://{http.url.split('://')[1]}/redirects/hf/model.safetensors"
    )
    with pytest.raises(suture.SurgeryError, match=r"on another scheme"):
        suture.open(f"{published}/tls.safetensors")


def test_a_redirect_loop_is_an_error(published: str, http) -> None:
    http.hostile["/redirects/loop.safetensors"] = Hostile(redirect="/redirects/loop.safetensors")
    with pytest.raises(suture.SurgeryError, match=r"redirects more than 5 times"):
        suture.open(f"{published}/loop.safetensors")


def test_http_errors_say_what_the_status_means(published: str, http) -> None:
    from suture._location import location_of

    with pytest.raises(suture.SurgeryError, match=r"HTTP 403 Forbidden: the server refuses"):
        location_of(f"{http.url}/forbidden/model.safetensors").read_range(0, 8)
    with pytest.raises(suture.CheckpointNotFoundError, match=r"No such file: .*missing"):
        location_of(f"{published}/missing.json").read_bytes()
    shown = runner.invoke(app, ["inspect", f"{http.url}/forbidden/model.safetensors"])
    assert shown.exit_code == 2 and "HTTP 403 Forbidden" in shown.output
    assert "credentials the driver reads" not in shown.output
