"""Object storage at a real bucket's latency: loads, a streamed surgery and a conversion.

fake-gcs-server and moto's S3 server run on 127.0.0.1, each behind a latency-and-bandwidth
proxy (`bench/_latency_proxy.py`: ``--latency-ms`` per request, 30 by default, and
``--bandwidth-mbs`` per connection, 200 MB/s by default; it counts requests and bytes).
The data is uploaded to the servers directly; every measured route goes through a proxy
(``TENSORSTORE_GCS_HTTP_URL``, ``STORAGE_EMULATOR_HOST`` and ``AWS_ENDPOINT_URL_S3`` name it).
Each route runs in a fresh process (wall: from before opening to the result being ready or
committed, imports excluded), after one discarded run of it. suture's writing routes (b)
and (c) run with ``SUTURE_TUNE_ALLOCATOR=1``: the process is theirs, as the command line's
is, which tunes the allocator itself (a load runs inside the caller's program: not tuned).

(a) params-only load of a stock Orbax checkpoint (params + Adam mu and nu, float32) from
    gs://: ``suture.load(url, suture.placeholders(url, skip="opt_state"))`` against Orbax v1
    ``ocp.load`` with PLACEHOLDER under opt_state (``epath`` through gcsfs).
(b) a streamed surgery gs:// -> gs:// of the same checkpoint: drop the optimizer state,
    stack the layers, cast to bfloat16 (``suture.save(suture.transform(rules, src), dst)``).
(c) a sharded safetensors Llama folder (bfloat16) -> MaxText layout with
    ``--recipe llama3.1:maxtext``, gs:// -> gs:// and s3:// -> s3://; beside each, a stock
    peer moving the same bytes through the same proxy to the same server, in requests of
    the same sizes, as many at once as suture has in flight (64 reads and 64 writes): the
    index and each shard's header, every tensor in ranged reads of at most 16 MiB, and as
    many bytes as that conversion uploaded, in 10 MiB objects written as the reads arrive.
    ``peer-gs`` does it with TensorStore's own kvstore (the client suture uses, with
    suture's request limits), ``peer-s3`` with plain boto3. What a peer takes over its
    floor is what the server and the proxy cost on this machine; the report also gives
    fake-gcs-server's own upload rate, measured without the proxy before the routes.

The floor of a route is the bytes it moved through the proxy (both ways) over one
connection's bandwidth. Goals (issue 30): loads at most Orbax's wall and requests; streamed
surgeries and conversions within 1.3x of the floor.
Run from the repository root: ``.venv/bin/python -m bench.remote``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench._common import (
    DATA_DIR,
    REPO_ROOT,
    machine,
    orbax_load_params_only,
    peak_rss_bytes,
    write_adam_checkpoint,
    write_section,
)
from bench._latency_proxy import stats_of

HF = DATA_DIR / "remote-hf"
LLAMA = dict(
    hidden_size=1024,
    intermediate_size=3584,
    num_attention_heads=16,
    num_key_value_heads=8,
    num_hidden_layers=8,
    vocab_size=32000,
    rms_norm_eps=1e-5,
    max_position_embeddings=4096,
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    tie_word_embeddings=False,
    rope_theta=500000.0,
)
MIB = 2**20
PEER_CONNECTIONS = 64  # suture's reads (and writes) in flight at most (`s3_request_concurrency`)
PEER_PART_BYTES = 16 << 20  # a ranged read's part, as suture cuts a long range
PEER_OBJECT_BYTES = 10 << 20  # about the size of the OCDBT data files suture uploads
# bytes each store's peer uploads (its conversion's), kept apart per store
PEER_UPLOAD = {"s3": "BENCH_PEER_UPLOAD_BYTES", "gs": "BENCH_PEER_UPLOAD_BYTES_GS"}
PEERS = {"gs": ("TensorStore", "tensorstore-peer"), "s3": ("boto3", "boto3-peer")}
SERVER_PROBE_OBJECTS = 22  # uploads of PEER_OBJECT_BYTES timed straight to fake-gcs-server


def worker(route: str, source: str, destination: str) -> None:
    import jax
    from etils import epath
    from orbax.checkpoint import v1  # noqa: F401 (every route imports before the clock starts)

    import suture
    from suture import rules
    from suture.families._convert import convert_with_recipe

    started, cpu_started = time.perf_counter(), time.process_time()
    if route == "suture-load":
        loaded = suture.load(source, suture.placeholders(source, skip="opt_state"))
        jax.block_until_ready(jax.tree.leaves(loaded["params"]))
    elif route == "orbax-load":
        loaded = orbax_load_params_only(epath.Path(source))
        jax.block_until_ready(jax.tree.leaves(loaded["params"]))
    elif route == "suture-surgery":
        surgery = [
            rules.drop("opt_state|step"),
            rules.stack(r"params/layer(?P<i>\d+)", into="params/layers"),
            rules.cast("params", "bfloat16"),
        ]
        suture.save(suture.transform(surgery, source), destination, progress=False)
    elif route == "suture-convert":
        convert_with_recipe(source, destination, "llama3.1:maxtext", progress=False)
    elif route == "boto3-peer":
        boto3_peer(source, destination)
    elif route == "tensorstore-peer":
        tensorstore_peer(source, destination)
    else:
        raise SystemExit(f"unknown route {route}")
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started  # all of this process's threads
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_rss_bytes": peak_rss_bytes()}))


def _header(name: str, head: bytes) -> tuple[str, int, dict]:
    """A shard's name, where its data starts and its header's entries, from its first bytes."""
    end = 8 + int.from_bytes(head[:8], "little")
    return name, end, json.loads(head[8:end])


def _peer_parts(headers: Iterable[tuple[str, int, dict]]) -> list[tuple[str, int, int]]:
    """(shard, start, count) of every tensor's bytes, in parts of at most PEER_PART_BYTES."""
    return [
        (name, data_start + begin + offset, min(PEER_PART_BYTES, end - begin - offset))
        for name, data_start, entries in headers
        for tensor, entry in entries.items()
        if tensor != "__metadata__"
        for begin, end in [entry["data_offsets"]]
        for offset in range(0, end - begin, PEER_PART_BYTES)
    ]


def _upload_as_reads_arrive(
    store: str, parts: list, arrived: Iterable[int], put: Callable[[int, int], Any]
) -> None:
    """Uploads as many bytes as `store`'s conversion did (`PEER_UPLOAD`; else what `parts`
    read), in objects of PEER_OBJECT_BYTES, each put (``put(index, size)``, a future) as soon
    as the reads' byte counts `arrived` so far make it up; then waits for the writes."""
    total = sum(count for *_, count in parts)
    share = int(os.environ.get(PEER_UPLOAD[store]) or total) / total  # bytes up per byte down
    writes: list = []
    ready = 0.0
    for count in arrived:
        ready += count * share
        while ready >= PEER_OBJECT_BYTES:
            writes.append(put(len(writes), PEER_OBJECT_BYTES))
            ready -= PEER_OBJECT_BYTES
    if ready >= 1:
        writes.append(put(len(writes), int(ready)))
    for done in writes:
        done.result()


def boto3_peer(source: str, destination: str) -> None:
    """The conversion's transfers done by plain boto3 (see the module's docstring, (c))."""
    import boto3  # this route's alone, as jax and suture are the others'
    import botocore.config

    bucket, _, folder = source.removeprefix("s3://").partition("/")
    out_bucket, _, out_folder = destination.removeprefix("s3://").partition("/")
    config = botocore.config.Config(max_pool_connections=2 * PEER_CONNECTIONS)
    client = boto3.client("s3", config=config)

    def get(name: str, start: int, count: int) -> bytes:
        ranged = {"Range": f"bytes={start}-{start + count - 1}"} if count else {}
        return client.get_object(Bucket=bucket, Key=f"{folder}/{name}", **ranged)["Body"].read()

    index = json.loads(get("model.safetensors.index.json", 0, 0))
    shards = sorted(set(index["weight_map"].values()))
    payload = os.urandom(PEER_OBJECT_BYTES)
    # reads and writes each have PEER_CONNECTIONS slots, as suture's have (`OrbaxSink`)
    with ThreadPoolExecutor(PEER_CONNECTIONS) as pool, ThreadPoolExecutor(PEER_CONNECTIONS) as up:
        heads = pool.map(lambda name: _header(name, get(name, 0, 64 << 10)), shards)
        parts = _peer_parts(heads)
        reads = [pool.submit(get, *part) for part in parts]

        def put(index: int, size: int) -> Any:
            key = f"{out_folder}/d/{index}"
            return up.submit(client.put_object, Bucket=out_bucket, Key=key, Body=payload[:size])

        arrived = (len(done.result()) for done in as_completed(reads))
        _upload_as_reads_arrive("s3", parts, arrived, put)


def tensorstore_peer(source: str, destination: str) -> None:
    """The conversion's transfers done by TensorStore's gcs kvstore, with suture's request
    limits (see the module's docstring, (c))."""
    import tensorstore as ts  # this route's alone, as boto3 is the s3 peer's

    from suture._location.remote import _CONTEXT_SPEC
    from suture.sinks.orbax import WRITE_RESOURCES

    bucket, _, folder = source.removeprefix("gs://").partition("/")
    out_bucket, _, out_folder = destination.removeprefix("gs://").partition("/")
    # reads share suture's context; the writes have slots of their own, as `OrbaxSink`'s
    reading = ts.Context(_CONTEXT_SPEC)
    writing = ts.Context(WRITE_RESOURCES, parent=reading)
    store = ts.KvStore.open({"driver": "gcs", "bucket": bucket}, context=reading).result()
    out = ts.KvStore.open({"driver": "gcs", "bucket": out_bucket}, context=writing).result()

    def read(name: str, start: int, count: int) -> Any:
        ranged = slice(start, start + count) if count else None
        return store.read(f"{folder}/{name}", byte_range=ranged)

    def value(future: Any) -> bytes:
        result = future.result()
        if result.state != "value":
            raise RuntimeError(f"a peer read found {result.state}")
        return result.value

    index = json.loads(value(read("model.safetensors.index.json", 0, 0)))
    shards = sorted(set(index["weight_map"].values()))
    payload = os.urandom(PEER_OBJECT_BYTES)
    heads = [(name, read(name, 0, 64 << 10)) for name in shards]
    parts = _peer_parts(_header(name, value(head)) for name, head in heads)
    done: queue.SimpleQueue = queue.SimpleQueue()
    reads = [read(*part) for part in parts]  # all issued; TensorStore keeps 64 in flight
    for future in reads:
        future.add_done_callback(done.put)

    def put(index: int, size: int) -> Any:
        return out.write(f"{out_folder}/d/{index}", payload[:size])

    arrived = (len(value(done.get())) for _ in reads)
    _upload_as_reads_arrive("gs", parts, arrived, put)


def _server_upload_rates(url: str, bucket: str) -> tuple[float, float]:
    """MB/s at which fake-gcs-server at `url` takes SERVER_PROBE_OBJECTS media uploads of
    PEER_OBJECT_BYTES straight (no proxy): one at a time, then all at once; the objects,
    under a scratch prefix, are deleted after."""
    address = urlsplit(url)
    body = os.urandom(PEER_OBJECT_BYTES)

    def request(method: str, path: str, data: bytes | None = None) -> None:
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=120)
        try:
            connection.request(method, path, body=data)
            answer = connection.getresponse()
            answer.read()
            if answer.status >= 300:
                raise RuntimeError(f"{method} {path}: {answer.status} {answer.reason}")
        finally:
            connection.close()

    def post(name: str) -> None:
        request("POST", f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}", body)

    names, rates = [], []
    for at_once in (1, SERVER_PROBE_OBJECTS):
        batch = [f"bench-scratch%2Fupload-{at_once}-{i}" for i in range(SERVER_PROBE_OBJECTS)]
        names += batch
        started = time.perf_counter()
        with ThreadPoolExecutor(at_once) as pool:
            list(pool.map(post, batch))
        elapsed = time.perf_counter() - started
        rates.append(SERVER_PROBE_OBJECTS * PEER_OBJECT_BYTES / 1e6 / elapsed)
    for name in names:
        request("DELETE", f"/storage/v1/b/{bucket}/o/{name}")
    return rates[0], rates[1]


def _server_cpu(store: str) -> float:
    """CPU seconds the store's server has used: moto runs in this process (whose other
    threads wait), fake-gcs-server is a child process."""
    if store == "s3":
        used = os.times()
        return used.user + used.system
    total = 0.0
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(OSError):
                if b"fake-gcs" in Path(f"/proc/{child}/cmdline").read_bytes():
                    fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
                    total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _measure(route: str, source: str, destination: str, proxy: str) -> dict:
    """One fresh-process run of `route`; its wall time, what went through the proxy, and
    the CPU time of the route's store server meanwhile."""
    store = source.split("://", 1)[0]
    before, load_before, cpu_before = stats_of(proxy), os.getloadavg()[0], _server_cpu(store)
    env = dict(os.environ)
    if route in ("suture-surgery", "suture-convert"):  # its own process, as the CLI's is
        env["SUTURE_TUNE_ALLOCATOR"] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "bench.remote", "--worker", route, source, destination],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
    )
    if done.returncode:
        raise RuntimeError(f"{route} failed:\n{done.stderr[-3000:]}")
    after = stats_of(proxy)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result.update(
        {key: after[key] - before[key] for key in ("requests", "bytes_up", "bytes_down")},
        load=(load_before + os.getloadavg()[0]) / 2,
        server_cpu_s=_server_cpu(store) - cpu_before,
    )
    return result


@contextlib.contextmanager
def _proxy(upstream: str, latency: float, bandwidth: float) -> Iterator[str]:
    from tests.remote_servers import free_port

    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench._latency_proxy",
            upstream,
            str(port),
            str(latency),
            str(bandwidth),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    try:
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError("the proxy did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def _checkpoint(layers: int, width: int) -> Path:
    return DATA_DIR / f"remote-{layers}x{width}"


def _prepare(layers: int, width: int) -> None:
    from bench.families import generate

    DATA_DIR.mkdir(exist_ok=True)
    write_adam_checkpoint(_checkpoint(layers, width), layers, width)
    if not (HF / "model.safetensors.index.json").exists():
        shutil.rmtree(HF, ignore_errors=True)
        generate(HF, LLAMA, "bfloat16", layers_per_shard=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=30.0)
    parser.add_argument("--bandwidth-mbs", type=float, default=200.0, help="MB/s (10^6 bytes)")
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", default="load,surgery,convert-gs,peer-gs,convert-s3,peer-s3")
    parser.add_argument("--section", default="remote", help="the RESULTS.md section written")
    parser.add_argument("--note", default="", help="a line added under the table")
    args = parser.parse_args()
    latency, bandwidth = args.latency_ms / 1000, args.bandwidth_mbs * 1e6
    cases = args.cases.split(",")

    from tests.remote_servers import BUCKET, environment, gcs_server, s3_server, upload

    _prepare(args.layers, args.width)
    checkpoint = _checkpoint(args.layers, args.width)
    stored = sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file())
    hf_bytes = sum(p.stat().st_size for p in HF.rglob("*") if p.is_file())
    server_root = DATA_DIR / "remote-gcs"
    shutil.rmtree(server_root, ignore_errors=True)
    runs: dict[str, list[dict]] = {}
    try:
        with gcs_server(server_root) as gcs_url, s3_server() as s3_url:
            upload(checkpoint, f"gs://{BUCKET}/ckpt")
            upload(HF, f"gs://{BUCKET}/hf")
            if "convert-s3" in cases or "peer-s3" in cases:
                upload(HF, f"s3://{BUCKET}/hf")
            server_rates = _server_upload_rates(gcs_url, BUCKET)
            with (
                _proxy(gcs_url, latency, bandwidth) as gcs_proxy,
                _proxy(s3_url, latency, bandwidth) as s3_proxy,
                environment(
                    TENSORSTORE_GCS_HTTP_URL=gcs_proxy,
                    STORAGE_EMULATOR_HOST=gcs_proxy,
                    AWS_ENDPOINT_URL_S3=s3_proxy,
                    GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false",  # gcsfs's gRPC probe stalls
                ),
            ):
                plan = []
                if "load" in cases:
                    for route in ("suture-load", "orbax-load"):
                        plan.append((f"(a) {route}", route, f"gs://{BUCKET}/ckpt", "", gcs_proxy))
                if "surgery" in cases:
                    plan.append(
                        ("(b) surgery gs->gs", "suture-surgery", f"gs://{BUCKET}/ckpt",
                         f"gs://{BUCKET}/out/surgery", gcs_proxy)
                    )  # fmt: skip
                for store, proxy in (("gs", gcs_proxy), ("s3", s3_proxy)):
                    if f"convert-{store}" in cases:
                        plan.append(
                            (f"(c) convert {store}->{store}", "suture-convert",
                             f"{store}://{BUCKET}/hf", f"{store}://{BUCKET}/out/maxtext", proxy)
                        )  # fmt: skip
                    if f"peer-{store}" in cases:  # after its conversion, whose upload it copies
                        library, route = PEERS[store]
                        plan.append(
                            (f"(c) {library} peer {store}->{store}", route,
                             f"{store}://{BUCKET}/hf", f"{store}://{BUCKET}/out/peer", proxy)
                        )  # fmt: skip
                for name, route, source, destination, proxy in plan:
                    store = source.split("://", 1)[0]
                    conversion = f"(c) convert {store}->{store}"
                    if route == PEERS[store][1] and conversion in runs:
                        # the peer uploads what the conversion uploaded (its workers see it)
                        uploaded = statistics.median(r["bytes_up"] for r in runs[conversion])
                        os.environ[PEER_UPLOAD[store]] = str(int(uploaded))
                    results = []
                    for attempt in range(args.repeats + 1):  # the first discarded
                        target = f"{destination}-{attempt}" if destination else ""
                        results.append(_measure(route, source, target, proxy))
                        print(name, json.dumps(results[-1]), flush=True)
                    runs[name] = results[1:]
    finally:  # everything the benchmark made goes (the checkpoint, the HF folder, the bucket)
        shutil.rmtree(server_root, ignore_errors=True)
        shutil.rmtree(_checkpoint(args.layers, args.width), ignore_errors=True)
        shutil.rmtree(HF, ignore_errors=True)
    report(args, runs, stored, hf_bytes, bandwidth, server_rates)


def report(
    args,
    runs: dict[str, list[dict]],
    stored: int,
    hf_bytes: int,
    bandwidth: float,
    server_rates: tuple[float, float],
) -> None:
    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[name])

    rows = []
    for name in runs:
        moved = median(name, "bytes_up") + median(name, "bytes_down")
        floor = moved / bandwidth
        rows.append(
            f"| {name} | {median(name, 'wall_s'):.2f} s | {median(name, 'requests'):.0f} "
            f"| {median(name, 'bytes_down') / MIB:.0f} / {median(name, 'bytes_up') / MIB:.0f} MiB "
            f"| {floor:.2f} s | **{median(name, 'wall_s') / floor:.2f}x** "
            f"| {median(name, 'cpu_s'):.2f} s | {median(name, 'server_cpu_s'):.2f} s "
            f"| {median(name, 'load'):.1f} |"
        )
    every = "; ".join(
        f"{name} " + ", ".join(f"{r['wall_s']:.2f}" for r in results)
        for name, results in runs.items()
    )
    command = (
        f"python -m bench.remote --latency-ms {args.latency_ms:g} --bandwidth-mbs "
        f"{args.bandwidth_mbs:g} --layers {args.layers} --width {args.width} --repeats "
        f"{args.repeats}"
    )
    body = f"""## remote: gs:// and s3:// at 30 ms and 200 MB/s per connection (issue 30)

`{command}` — {machine()}; fake-gcs-server and moto's S3 server on 127.0.0.1, each behind
the benchmark's proxy ({args.latency_ms:g} ms per request, {args.bandwidth_mbs:g} MB/s per
connection, requests and bytes counted by it). Median of {args.repeats} runs per route, each
a fresh process after one discarded run (wall: from before opening to the arrays being
ready or the checkpoint committed, imports excluded; suture's writes with
`SUTURE_TUNE_ALLOCATOR=1`, the command line's allocator tuning). CPU: the route's process meanwhile
(its threads together; the machine has 2 cores, shared with the proxies and the servers).
Server CPU: what the route's store
server (fake-gcs-server, or moto, one Python process) used meanwhile; moto reads a whole
object for every ranged GET. The machine is shared: the load average (1 min) during each
route is in the last column.
Checkpoint (a, b): stock `StandardCheckpointer`, {args.layers} layers of
({args.width}, {args.width}) float32 kernels + biases for params, mu and nu,
{stored / MIB:.0f} MiB stored. HF folder (c): Llama, hidden {LLAMA["hidden_size"]},
{LLAMA["num_hidden_layers"]} layers, bfloat16, {hf_bytes / MIB:.0f} MiB in 5 shards.

| route | wall | requests | down / up through the proxy | floor (bytes / bandwidth) | wall / floor | CPU | server CPU | load |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
{chr(10).join(rows)}

- Every run's wall time: {every}.
- fake-gcs-server's own upload rate (no proxy): {server_rates[0]:.0f} MB/s one at a time,
  {server_rates[1]:.0f} MB/s {SERVER_PROBE_OBJECTS} at once ({SERVER_PROBE_OBJECTS} media
  uploads of {PEER_OBJECT_BYTES // MIB} MiB).
{args.note}
"""
    write_section(args.section, body)
    print(body)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        main()
