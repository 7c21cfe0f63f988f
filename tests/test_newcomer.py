"""A newcomer's first hour: outputs that load as they say, calls that do not crash, and
messages a new user can act on (issue: silent wrong dtypes, crashes, rough edges)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import suture
from suture.cli import app
from tests.orbax_writers import save_standard

torch = pytest.importorskip("torch", reason="transformers' models need torch (the dev extra)")
transformers = pytest.importorskip("transformers", reason="in the dev extra")

runner = CliRunner()


def tiny_llama(folder: Path, seed: int = 0) -> None:
    """A 2-layer Llama saved by transformers 5, whose config.json says ``"dtype": "float32"``."""
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
    )
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)


def loaded_dtypes(folder: Path) -> set[torch.dtype]:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    return {parameter.dtype for parameter in model.parameters()}


def test_convert_dtype_writes_the_config_fields_transformers_reads(tmp_path: Path) -> None:
    tiny_llama(tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["dtype"] == "float32"
    done = runner.invoke(
        app,
        ["convert", str(tmp_path / "hf"), str(tmp_path / "out"), "--dtype", "bfloat16"]
        + ["--format", "safetensors", "--no-progress"],
    )
    assert done.exit_code == 0, done.output
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    assert config.get("torch_dtype", "bfloat16") == "bfloat16"
    assert loaded_dtypes(tmp_path / "out") == {torch.bfloat16}
    # through Orbax (which keeps the config beside it) and back: still bfloat16
    through = ["convert", str(tmp_path / "hf"), str(tmp_path / "orbax"), "--dtype", "bfloat16"]
    assert runner.invoke(app, [*through, "--no-progress"]).exit_code == 0
    back = ["convert", str(tmp_path / "orbax"), str(tmp_path / "back"), "--format", "safetensors"]
    assert runner.invoke(app, [*back, "--no-progress"]).exit_code == 0
    assert loaded_dtypes(tmp_path / "back") == {torch.bfloat16}


def test_convert_without_a_cast_copies_the_config_byte_for_byte(tmp_path: Path) -> None:
    tiny_llama(tmp_path / "hf")
    args = ["convert", str(tmp_path / "hf"), str(tmp_path / "out"), "--format", "safetensors"]
    assert runner.invoke(app, [*args, "--no-progress"]).exit_code == 0
    assert (tmp_path / "out" / "config.json").read_bytes() == (
        tmp_path / "hf" / "config.json"
    ).read_bytes()


def test_merge_dtype_writes_dtype_and_torch_dtype(tmp_path: Path) -> None:
    tiny_llama(tmp_path / "a", seed=1)
    tiny_llama(tmp_path / "b", seed=2)
    config = tmp_path / "merge.yml"
    config.write_text(
        "merge_method: linear\n"
        "models:\n"
        "  - model: a\n    parameters: {weight: 0.5}\n"
        "  - model: b\n    parameters: {weight: 0.5}\n"
        "dtype: bfloat16\n"
    )
    done = runner.invoke(app, ["merge", str(config), "-o", str(tmp_path / "out"), "--no-progress"])
    assert done.exit_code == 0, done.output
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["dtype"] == written["torch_dtype"] == "bfloat16"
    assert loaded_dtypes(tmp_path / "out") == {torch.bfloat16}


def test_map_takes_numpy_ufuncs_and_numpy_code_jax_cannot_trace() -> None:
    # in a process of its own: jax 0.10 handed a ufunc crashed the process on the second call
    script = """
import numpy as np, suture
x = suture.LazyArray.from_array(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
for _ in range(3):
    tanh = suture.map(np.tanh, x)
    assert (tanh.shape, tanh.dtype) == ((2, 3), np.float32)
    np.testing.assert_allclose(tanh.read(), np.tanh(x.read()))
row = suture.LazyArray.from_array(np.arange(3, dtype=np.int64))
added = suture.map(np.add, x, row)  # broadcasting, numpy's promotion
assert (added.shape, added.dtype) == ((2, 3), np.float64)
numpy_only = suture.map(lambda a: np.tanh(a) * 2, x)  # numpy on tracers fails in jax
np.testing.assert_allclose(numpy_only.read(), np.tanh(x.read()) * 2)
big = suture.LazyArray.from_array(np.zeros((2048, 1024), np.float32))
halved = suture.map(lambda a: np.log1p(a) / 2, big, elementwise=True)
assert (halved.shape, halved.dtype) == ((2048, 1024), np.float32)
try:
    suture.map(lambda a: np.log1p(a).sum(axis=0), big)
except suture.SurgeryError as error:
    assert "Pass shape= and dtype=" in str(error), error
else:
    raise AssertionError("no error for a too large input")
try:
    suture.map(np.divmod, x, x)
except suture.SurgeryError as error:
    assert "must return one" in str(error), error
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


def manager_with_items(root: Path) -> None:
    """A CheckpointManager run with items ``model`` and ``optimizer``, as Flax users save."""
    import orbax.checkpoint as ocp  # heavy: loaded on first use, not at import

    model = {"embed": {"embedding": np.ones((4, 2), np.float32)}}
    optimizer = {"step": np.asarray(3, np.int32), "mu": {"embed": np.zeros((4, 2), np.float32)}}
    with ocp.CheckpointManager(root, item_names=("model", "optimizer")) as manager:
        manager.save(
            3,
            args=ocp.args.Composite(
                model=ocp.args.StandardSave(model), optimizer=ocp.args.StandardSave(optimizer)
            ),
        )
        manager.wait_until_finished()


def test_the_plan_names_sources_with_their_checkpoint_manager_item(tmp_path: Path) -> None:
    manager_with_items(tmp_path / "run")
    recipe = tmp_path / "rename.yaml"
    recipe.write_text("- rename: {pattern: model/embed, to: params/embed}\n")
    expected = {
        "params/embed/embedding": ["model/embed/embedding"],
        "optimizer/mu/embed": ["optimizer/mu/embed"],
        "optimizer/step": ["optimizer/step"],
    }
    planned = suture.plan([suture.rules.rename("model/embed", "params/embed")], tmp_path / "run")
    assert {output.path: output.sources for output in planned.outputs} == expected
    shown = runner.invoke(app, ["plan", str(recipe), str(tmp_path / "run")])
    assert shown.exit_code == 0, shown.output
    assert "model/embed/embedding" in shown.output
    assert "optimizer/step" in shown.output
    as_json = runner.invoke(app, ["plan", str(recipe), str(tmp_path / "run"), "--json"])
    outputs = json.loads(as_json.output)["outputs"]
    assert {output["path"]: output["sources"] for output in outputs} == expected


def test_follow_finds_flax_nnx_params_and_their_optimizer_state(tmp_path: Path) -> None:
    import optax
    from flax import nnx

    class Old(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.linear = nnx.Linear(2, 3, rngs=rngs)
            self.head = nnx.Linear(3, 1, rngs=rngs)

    class New(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.encoder = nnx.Linear(2, 3, rngs=rngs)
            self.head = nnx.Linear(3, 1, rngs=rngs)

    old = Old(nnx.Rngs(0))
    old_optimizer = nnx.Optimizer(old, optax.adam(0.1), wrt=nnx.Param)
    old_optimizer.update(
        old, nnx.grad(lambda m: (m.head(m.linear(np.ones((1, 2)))) ** 2).sum())(old)
    )
    suture.save({"model": nnx.state(old), "optimizer": nnx.state(old_optimizer)}, tmp_path / "run")
    model = New(nnx.Rngs(1))
    optimizer = nnx.Optimizer(model, optax.adam(0.1), wrt=nnx.Param)
    renamed = suture.optax.follow([suture.rules.rename("model/linear", "model/encoder")])
    target = {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}
    restored = suture.load_and_transform(renamed, tmp_path / "run", target=target)
    nnx.update(model, restored["model"])
    nnx.update(optimizer, restored["optimizer"])
    np.testing.assert_array_equal(model.encoder.kernel[...], old.linear.kernel[...])
    mu, old_mu = optimizer.opt_state[0].mu, old_optimizer.opt_state[0].mu
    np.testing.assert_array_equal(mu["encoder"]["kernel"][...], old_mu["linear"]["kernel"][...])
    assert int(optimizer.step[...]) == 1
    # a tree without params or model, and no mirrored subtree: an error naming root=
    tree = {"state": {"w": np.ones(2)}, "step": np.asarray(1)}
    with pytest.raises(suture.SurgeryError, match=r"Pass root= naming the subtree"):
        suture.rules.apply_rules(
            suture.optax.follow([suture.rules.rename("state/w", "state/v")]), tree
        )
    explicit = suture.optax.follow([suture.rules.rename("state/w", "state/v")], root="state")
    assert sorted(suture.flatten(suture.rules.apply_rules(explicit, tree))) == ["state/v", "step"]


_LOAD_ON_ONE_DEVICE = """
import sys
import jax, numpy as np, suture
from flax import nnx
assert len(jax.devices()) == 1
path = sys.argv[1]
loaded = suture.nnx.load_into(lambda: nnx.Linear(8, 16, rngs=nnx.Rngs(1)), path)
assert loaded.kernel[...].sharding == jax.sharding.SingleDeviceSharding(jax.devices()[0])
np.testing.assert_array_equal(loaded.kernel[...], np.load(sys.argv[2]))

class Annotated(nnx.Module):
    def __init__(self, rngs):
        init = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "x"))
        self.linear = nnx.Linear(8, 16, kernel_init=init, rngs=rngs)

def factory():
    return Annotated(nnx.Rngs(1))

with nnx.use_eager_sharding(False):
    try:
        suture.nnx.load_into(factory, path, lambda tree: {"linear": tree})
    except suture.SurgeryError as error:
        assert "jax.set_mesh" in str(error) and "mesh=" in str(error), error
    else:
        raise AssertionError("an annotated model without a mesh loaded")
print("ok")
"""


def test_load_into_a_factory_on_one_device_from_a_checkpoint_of_eight(tmp_path: Path) -> None:
    import jax
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    assert len(jax.devices()) == 8  # tests/conftest.py
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
    state = nnx.state(nnx.Linear(8, 16, rngs=nnx.Rngs(0)))
    spread = jax.tree.map(
        lambda a: jax.device_put(a, NamedSharding(mesh, P(None, "x") if a.ndim == 2 else P("x"))),
        state,
    )
    save_standard(tmp_path / "ckpt", spread)  # Orbax records the 8 devices' sharding
    np.save(tmp_path / "kernel.npy", np.asarray(state["kernel"][...]))
    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_ON_ONE_DEVICE, str(tmp_path / "ckpt")]
        + [str(tmp_path / "kernel.npy")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


def test_a_budget_error_names_a_budget_that_works_and_advice_that_exists(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for name in ("a", "b"):  # 8 MiB each: a slerp computes the whole leaf at once
        suture.save({"w": rng.standard_normal((1024, 2048)).astype(np.float32)}, tmp_path / name)
    config = tmp_path / "slerp.yaml"
    config.write_text(
        f"method: slerp\nmodels: [{tmp_path / 'a'}, {tmp_path / 'b'}]\nparams: {{t: 0.5}}\n"
    )

    def merge(budget: str, out: str):
        args = ["merge", str(config), "-o", str(tmp_path / out), "--max-memory", budget]
        return runner.invoke(app, [*args, "--no-progress"])

    refused = merge("16MiB", "small")
    assert refused.exit_code == 2
    message = " ".join(refused.output.split())
    suggested = re.search(r"Pass --max-memory (\d+MiB) or more", message)
    assert suggested, message
    assert "chunk_bytes" not in message and "elementwise" not in message  # no such flags
    done = merge(suggested.group(1), "enough")  # the budget it names is enough: no second error
    assert done.exit_code == 0, done.output
    # in Python, the advice names Python's arguments
    stored = suture.open(tmp_path / "a")["w"]
    whole = suture.map(lambda x: x / np.linalg.norm(x), stored, shape=stored.shape, dtype="float32")
    with pytest.raises(suture.SurgeryError) as error:
        suture.save({"w": whole}, tmp_path / "python", max_memory="16MiB")
    assert "Pass max_memory='" in str(error.value)
    assert "chunk_bytes=" in str(error.value) and "elementwise=True" in str(error.value)


def test_demo_takes_a_relative_workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    done = runner.invoke(app, ["demo", "--workdir", "demo_wd/nested"])
    assert done.exit_code == 0, done.output
    assert "Done:" in done.output
    written = sorted(path.name for path in (tmp_path / "demo_wd" / "nested").iterdir())
    assert written == ["mlp_checkpoint", "mlp_for_scan"]  # no *.orbax-checkpoint-tmp left
    (tmp_path / "a_file").write_text("")
    refused = runner.invoke(app, ["demo", "--workdir", "a_file"])
    assert refused.exit_code == 2 and refused.output.startswith("Error: Cannot use 'a_file'")


def test_integer_leaves_of_a_merge_come_from_the_base_or_first_model(tmp_path: Path) -> None:
    def state(step: int, value: float) -> dict:
        return {
            "params": {"w": np.full(3, value, np.float32)},
            "opt_state": {"count": np.asarray(step, np.int32)},
            "step": np.asarray(step, np.int32),
        }

    for name, step, value in (("a", 2, 1.0), ("b", 3, 2.0), ("base", 1, 0.0)):
        suture.save(state(step, value), tmp_path / name)
    averaged = suture.load(
        suture.merge([tmp_path / "a", tmp_path / "b"], "linear", dtype="bfloat16")
    )
    assert averaged["step"] == 2 and averaged["step"].dtype == np.int32  # a's, not int(2.5)
    assert averaged["opt_state"]["count"] == 2
    assert averaged["params"]["w"].dtype.name == "bfloat16"
    np.testing.assert_array_equal(averaged["params"]["w"].astype(np.float32), 1.5)
    tied = suture.merge([tmp_path / "a", tmp_path / "b"], "ties", base=tmp_path / "base")
    assert suture.load(tied)["step"] == 1  # the base's
    # through the command line, and with per_leaf take: another model's
    config = tmp_path / "merge.yaml"
    config.write_text(
        f"method: linear\nmodels: [{tmp_path / 'a'}, {tmp_path / 'b'}]\n"
        "per_leaf: {step: {take: 1}}\n"
    )
    done = runner.invoke(app, ["merge", str(config), "-o", str(tmp_path / "out"), "--no-progress"])
    assert done.exit_code == 0, done.output
    written = suture.load(tmp_path / "out")
    assert written["step"] == 3 and written["opt_state"]["count"] == 2


def test_a_plan_prints_its_problems_before_the_table(tmp_path: Path) -> None:
    suture.save({f"layer{i}": {"w": np.ones(2, np.float32)} for i in range(60)}, tmp_path / "c")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "- rename: {pattern: nope, to: x}\n- cast: {pattern: layer1/w, dtype: bfloat16}\n"
    )
    shown = runner.invoke(app, ["plan", str(recipe), str(tmp_path / "c")])
    assert shown.exit_code == 2
    lines = shown.output.splitlines()
    assert lines[0] == "1 problem(s):" and "rename('nope', 'x') matches no path" in lines[1]
    assert lines[-1] == "1 problem(s), listed above."
    alone = runner.invoke(app, ["plan", str(recipe), str(tmp_path / "c"), "--problems"])
    assert alone.exit_code == 2
    assert alone.output.splitlines() == lines[:2]
    recipe.write_text("- cast: {pattern: layer1/w, dtype: bfloat16}\n")
    fine = runner.invoke(app, ["plan", str(recipe), str(tmp_path / "c"), "--problems"])
    assert fine.exit_code == 0 and fine.output == "No problems.\n"


@pytest.mark.parametrize("name", ["llama31:maxtext", "llama31", "llama3.1:maxtex"])
def test_a_misspelt_recipe_name_gets_did_you_mean(tmp_path: Path, name: str) -> None:
    suture.save({"w": np.ones(2, np.float32)}, tmp_path / "ckpt")
    done = runner.invoke(
        app, ["convert", str(tmp_path / "ckpt"), str(tmp_path / "out"), "--recipe", name]
    )
    assert done.exit_code == 2
    assert done.output.startswith(f"Error: No built-in recipe {name!r}")
    assert "Did you mean:\n  llama3.1:maxtext\n" in done.output


def test_rename_to_nothing_lifts_the_subtree_without_a_leading_separator() -> None:
    tree = {"model": {"dense": {"w": np.ones(1)}, "b": np.ones(1)}, "step": np.ones(1)}
    lifted = suture.rules.apply_rules([suture.rules.rename("model", "")], tree)
    assert sorted(suture.flatten(lifted)) == ["b", "dense/w", "step"]
    with pytest.raises(suture.SurgeryError, match="to an empty path"):
        suture.rules.apply_rules([suture.rules.rename("step", "")], tree)


def test_inspect_stats_honours_depth(tmp_path: Path) -> None:
    tree = {"params": {"a": np.asarray([0.0, 2.0], np.float32), "b": np.asarray([4.0, 6.0])}}
    suture.save({**tree, "step": np.asarray(3, np.int32)}, tmp_path / "c")
    shown = runner.invoke(app, ["inspect", str(tmp_path / "c"), "--stats", "--depth", "1"])
    assert shown.exit_code == 0, shown.output
    rows = [line.split() for line in shown.output.splitlines()[1:-1]]
    assert rows[0] == ["params/", "mixed", "2", "arrays", "0", "6", "3", "2.23607", "0"]
    assert rows[1][0] == "step" and len(rows) == 2


@pytest.mark.parametrize(
    ("alias", "name"), [("bf16", "bfloat16"), ("fp16", "float16"), ("f32", "float32")]
)
def test_dtype_aliases(tmp_path: Path, alias: str, name: str) -> None:
    suture.save({"w": np.ones(2, np.float64)}, tmp_path / "c")
    args = ["convert", str(tmp_path / "c"), str(tmp_path / "out"), "--dtype", alias]
    assert runner.invoke(app, args).exit_code == 0
    assert suture.open(tmp_path / "out")["w"].dtype.name == name


def test_help_short_option_flags_and_wrapping() -> None:
    for command in ([], ["apply"], ["merge"], ["convert"]):
        assert runner.invoke(app, [*command, "-h"], env={"COLUMNS": "80"}).exit_code == 0
    shown = runner.invoke(app, ["apply", "-h"], env={"COLUMNS": "80"}).output
    assert "<bool>" not in shown  # flags take no value
    assert "--max-memory" in shown and "(default: 1GiB)" in " ".join(shown.split())
    # each paragraph fills its lines: no line of prose ends after a word or two
    prose = shown[shown.index("RECIPE is") : shown.index("╭")].splitlines()
    short = [line for line in prose[:-1] if line.strip() and len(line.strip()) < 40]
    assert len(short) <= 2, prose  # the last line of each paragraph only


def test_convert_dry_run_and_verify(tmp_path: Path) -> None:
    suture.save({"w": np.ones(2, np.float32)}, tmp_path / "c")
    args = ["convert", str(tmp_path / "c"), str(tmp_path / "out"), "--dtype", "bf16"]
    planned = runner.invoke(app, [*args, "--dry-run"])
    assert planned.exit_code == 0 and "cast bfloat16" in planned.output
    assert not (tmp_path / "out").exists()
    verified = runner.invoke(app, [*args, "--verify"])
    assert verified.exit_code == 0 and verified.output.rstrip().endswith("verified.")


def test_progress_eta_waits_for_a_meaningful_average() -> None:
    from suture._exec.progress import time_left

    assert time_left(0.2, 1, 100) is None  # too early: opening files, starting threads
    assert time_left(5.0, 1, 1000) is None  # too little done to extrapolate
    assert time_left(3.0, 50, 100) == 3.0  # at the average speed so far


def test_packaging_metadata_is_current() -> None:
    import tomllib

    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"  # SPDX: no setuptools deprecation
    assert project["project"]["optional-dependencies"]["torch"] == ["torch>=2.13"]
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    heading = re.search(r"^## (\w+) commands\n\n```bash\n(.*?)```", readme, re.S | re.M)
    assert heading, "the README's commands heading"
    count = len([line for line in heading.group(2).splitlines() if line.startswith("make ")])
    assert heading.group(1).lower() == {2: "two", 3: "three", 4: "four"}[count]


def test_remote_storage_snippet_runs_on_local_paths(tmp_path: Path) -> None:
    page = (Path(__file__).parent.parent / "docs" / "guide" / "remote-storage.md").read_text()
    block = re.search(r"```text\n(import suture\n.*?)```", page, re.S).group(1)
    ckpt = tmp_path / "checkpoints"
    suture.save(
        {
            "params": {"embed": {"embedding": np.ones((64, 8), np.float32)}},
            "opt_state": {"mu": {"embed": {"embedding": np.zeros((64, 8), np.float32)}}},
        },
        ckpt,
    )
    code = block.replace("gs://my-bucket/runs/llm/checkpoints", str(ckpt))
    code = code.replace("s3://other-bucket/llm-bf16", str(tmp_path / "bf16"))
    exec(compile(code, "remote-storage.md", "exec"), {})
    assert sorted(suture.flatten(suture.open(tmp_path / "bf16").tree)) == ["params/embed/embedding"]


def test_mergekit_tokenizer_source_base_and_mergekit_config_yml(tmp_path: Path) -> None:
    for name, seed in (("base", 0), ("a", 1), ("b", 2)):
        tiny_llama(tmp_path / name, seed=seed)
        (tmp_path / name / "tokenizer.json").write_text(json.dumps({"model": name}))
    text = (
        "merge_method: ties\nbase_model: base\ntokenizer_source: base\n"
        "models:\n  - model: a\n    parameters: {weight: 0.5, density: 0.5}\n"
        "  - model: b\n    parameters: {weight: 0.5, density: 0.5}\n"
    )
    config = tmp_path / "ties.yml"
    config.write_text(text)
    done = runner.invoke(app, ["merge", str(config), "-o", str(tmp_path / "out"), "--no-progress"])
    assert done.exit_code == 0, done.output
    assert (tmp_path / "out" / "mergekit_config.yml").read_text() == text
    assert json.loads((tmp_path / "out" / "tokenizer.json").read_text()) == {"model": "base"}
    assert loaded_dtypes(tmp_path / "out") == {torch.float32}
    # no base_model: the first model is the base (mergekit/tokenizer/build.py), its files
    linear = (
        "merge_method: linear\ntokenizer_source: base\n"
        "models:\n  - model: a\n    parameters: {weight: 0.5}\n"
        "  - model: b\n    parameters: {weight: 0.5}\n"
    )
    (tmp_path / "linear.yml").write_text(linear)
    first = runner.invoke(
        app, ["merge", str(tmp_path / "linear.yml"), "-o", str(tmp_path / "o1"), "--no-progress"]
    )
    assert first.exit_code == 0, first.output
    assert json.loads((tmp_path / "o1" / "tokenizer.json").read_text()) == {"model": "a"}
    # other tokenizer sources are still refused, with what suture does instead
    config.write_text(text.replace("tokenizer_source: base", "tokenizer_source: union"))
    refused = runner.invoke(app, ["merge", str(config), "-o", str(tmp_path / "o2")])
    assert refused.exit_code == 2
    assert "tokenizer_source: base" in refused.output


def sentence_transformer(folder: Path) -> None:
    """A tiny BERT saved by transformers, laid out as sentence-transformers saves a model."""
    config = transformers.BertConfig(
        vocab_size=32,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=16,
    )
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(folder)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_mean_tokens": True})
    )
    (folder / "onnx").mkdir()  # an export of the original weights: not the converted model's
    (folder / "onnx" / "model.onnx").write_bytes(b"\0" * 16)


def test_hf_folders_keep_sentence_transformers_modules(tmp_path: Path) -> None:
    sentence_transformer(tmp_path / "st")
    pooling = (tmp_path / "st" / "1_Pooling" / "config.json").read_text()
    out = tmp_path / "out"
    args = ["convert", str(tmp_path / "st"), str(out), "--format", "safetensors", "--dtype", "bf16"]
    assert runner.invoke(app, [*args, "--no-progress"]).exit_code == 0
    assert (out / "modules.json").is_file() and not (out / "onnx").exists()
    assert (out / "1_Pooling" / "config.json").read_text() == pooling
    model = transformers.AutoModel.from_pretrained(out)
    assert {parameter.dtype for parameter in model.parameters()} == {torch.bfloat16}
    # through Orbax and back; and converting to Orbax says what it wrote and how to get HF
    to_orbax = runner.invoke(app, ["convert", str(tmp_path / "st"), str(tmp_path / "orbax")])
    assert to_orbax.exit_code == 0, to_orbax.output
    assert "pass --format safetensors" in " ".join(to_orbax.output.split())
    back = ["convert", str(tmp_path / "orbax"), str(tmp_path / "back"), "--format", "safetensors"]
    assert runner.invoke(app, [*back, "--no-progress"]).exit_code == 0
    assert (tmp_path / "back" / "1_Pooling" / "config.json").read_text() == pooling
    transformers.AutoModel.from_pretrained(tmp_path / "back")


def test_nnx_state_to_safetensors_names_tensors_without_value(tmp_path: Path) -> None:
    from flax import nnx

    suture.save(nnx.state(nnx.Linear(2, 3, rngs=nnx.Rngs(0))), tmp_path / "nnx")
    out = tmp_path / "linear.safetensors"
    assert runner.invoke(app, ["convert", str(tmp_path / "nnx"), str(out)]).exit_code == 0
    assert sorted(suture.open(out).tree) == ["bias", "kernel"]
    kept = tmp_path / "kept.safetensors"
    args = ["convert", str(tmp_path / "nnx"), str(kept), "--keep-value-keys"]
    assert runner.invoke(app, args).exit_code == 0
    assert sorted(suture.flatten(suture.open(kept).tree)) == ["bias/value", "kernel/value"]


def test_a_family_table_of_ones_own_converts_both_ways(tmp_path: Path) -> None:
    from importlib.resources import files

    tiny_llama(tmp_path / "hf")
    table = files("suture.families").joinpath("llama3.1.yaml").read_text()
    mine = tmp_path / "my_family.yaml"
    mine.write_text(table.replace("names: [llama3.1]", "names: [my_llama]"))
    shown = runner.invoke(
        app, ["recipes", str(mine), "--config", str(tmp_path / "hf" / "config.json")]
    )
    assert shown.exit_code == 0, shown.output
    assert shown.output.startswith("my_llama:maxtext:") and "interleave rope" in shown.output
    to_maxtext = ["convert", str(tmp_path / "hf"), str(tmp_path / "mt"), "--recipe", str(mine)]
    assert runner.invoke(app, [*to_maxtext, "--no-progress"]).exit_code == 0
    builtin = ["convert", str(tmp_path / "hf"), str(tmp_path / "mt_builtin")]
    assert (
        runner.invoke(app, [*builtin, "--recipe", "llama3.1:maxtext", "--no-progress"]).exit_code
        == 0
    )
    done = runner.invoke(
        app, ["diff", str(tmp_path / "mt"), str(tmp_path / "mt_builtin"), "--values"]
    )
    assert done.exit_code == 0, done.output  # the same table gives the same checkpoint
    back = ["convert", str(tmp_path / "mt"), str(tmp_path / "back"), "--recipe", str(mine)]
    assert runner.invoke(app, [*back, "--reverse", "--no-progress"]).exit_code == 0
    assert loaded_dtypes(tmp_path / "back") == {torch.float32}
    flat = [*to_maxtext[:2], str(tmp_path / "flat"), "--recipe", f"{mine}:maxtext-unscanned"]
    assert runner.invoke(app, [*flat, "--no-progress"]).exit_code == 0
    assert any("layers_0" in path for path in suture.flatten(suture.open(tmp_path / "flat").tree))
    # suture apply takes rule recipes: a table gets the way to use it
    refused = runner.invoke(
        app, ["apply", str(mine), str(tmp_path / "hf"), "-o", str(tmp_path / "x")]
    )
    assert refused.exit_code == 2 and "suture convert" in refused.output


def _rule_table() -> list[list[str]]:
    page = (Path(__file__).parent.parent / "docs" / "guide" / "restructuring.md").read_text()
    section = page[page.index("### Every rule") : page.index("### A Hugging Face Linear")]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "`" in line]
    return [[cell.strip().strip("`") for cell in row.strip("|").split(" | ")] for row in rows]


def test_one_table_of_rules_matches_the_code(tmp_path: Path) -> None:
    from suture._surgery.recipe_schema import RULE_NAMES
    from suture._surgery.recipes import load_recipe

    rows = _rule_table()
    assert [row[0] for row in rows] == [*RULE_NAMES, "map_values"]  # every rule, once

    def fresh(name: str) -> dict:
        """A tree each example applies to, without the leaves its example writes."""
        zeros = lambda *shape: np.zeros(shape, np.float32)  # noqa: E731
        params = {"dense": {"kernel": zeros(4, 4), "bias": zeros(4)}, "q": zeros(4, 2)}
        params.update(k=zeros(4, 2), qk=zeros(4, 4), qkv=zeros(64, 3, 64), layers=zeros(2, 4))
        params.update(layer0=zeros(4), layer1=zeros(4))
        written = {"stack": ["layers"], "unstack": ["layer0", "layer1"], "concat": ["qk"]}
        for key in written.get(name, ["q", "k"] if name == "split" else []):
            del params[key]
        return {"opt_state": {"mu": zeros(2)}, "params": params}

    namespace = {"rules": suture.rules, "fn": lambda x: x * 2, "back": lambda x: x / 2}
    for name, python, yaml_text, inverse in rows:
        rule = eval(python, namespace)  # noqa: S307 (the docs' own text)
        suture.rules.apply_rules([rule], fresh(name))  # the example applies
        if yaml_text != "Python only":
            recipe = tmp_path / f"{name}.yaml"
            recipe.write_text(yaml_text + "\n")
            assert load_recipe(recipe).transform == [rule], name  # both spellings are one rule
        if inverse.startswith("none"):
            with pytest.raises(suture.SurgeryError, match="has no inverse"):
                suture.rules.reverse([rule], like=fresh(name))
        else:
            undone = suture.rules.reverse([rule], like=fresh(name))
            back = suture.rules.apply_rules(undone, suture.rules.apply_rules([rule], fresh(name)))
            assert sorted(suture.flatten(back)) == sorted(suture.flatten(fresh(name))), name
    shown = " ".join(runner.invoke(app, ["apply", "--help"], env={"COLUMNS": "200"}).output.split())
    assert all(name in shown for name in RULE_NAMES)
    refused = tmp_path / "bad.yaml"
    refused.write_text("- flip: params\n")
    error = runner.invoke(app, ["plan", str(refused), str(tmp_path)]).output
    assert all(name in error for name in RULE_NAMES)


def test_pad_new_rows_with_the_mean_or_the_models_initial_values(tmp_path: Path) -> None:
    from flax import nnx

    rows = np.arange(8, dtype=np.float32).reshape(4, 2)
    suture.save({"embedding": rows}, tmp_path / "ckpt")
    target = {"embedding": np.zeros((6, 2), np.float32)}
    loaded = suture.load(tmp_path / "ckpt", target, pad_truncate="mean")["embedding"]
    np.testing.assert_array_equal(loaded[:4], rows)
    np.testing.assert_array_equal(loaded[4:], np.broadcast_to(rows.mean(axis=0), (2, 2)))
    zeros = suture.load(tmp_path / "ckpt", target, pad_truncate=True)["embedding"]
    assert not zeros[4:].any()

    def factory() -> nnx.Embed:
        return nnx.Embed(6, 2, rngs=nnx.Rngs(3))

    own = factory().embedding[...]
    initialized = suture.nnx.load_into(factory, tmp_path / "ckpt", pad_truncate="init")
    np.testing.assert_array_equal(initialized.embedding[...][:4], rows)
    np.testing.assert_allclose(initialized.embedding[...][4:], own[4:], rtol=1e-6)  # under jit
    live = suture.nnx.load_into(factory(), tmp_path / "ckpt", pad_truncate="init")
    np.testing.assert_array_equal(live.embedding[...][4:], own[4:])
    averaged = suture.nnx.load_into(factory, tmp_path / "ckpt", pad_truncate="mean")
    np.testing.assert_allclose(averaged.embedding[...][5], rows.mean(axis=0))
    with pytest.raises(suture.SurgeryError, match="pad_truncate='noise'"):
        suture.load(tmp_path / "ckpt", target, pad_truncate="noise")


def test_checkpoint_manager_items_and_steps(tmp_path: Path) -> None:
    import orbax.checkpoint as ocp

    manager_with_items(tmp_path / "run")
    model = suture.open(tmp_path / "run", item="model")
    assert sorted(suture.flatten(model.tree)) == ["embed/embedding"] and model.step == 3
    with pytest.raises(
        suture.SurgeryError, match="no item 'modle' in step 3. Did you mean 'model'"
    ):
        suture.open(tmp_path / "run", item="modle")
    shown = runner.invoke(app, ["inspect", str(tmp_path / "run"), "--item", "optimizer", "--flat"])
    assert shown.exit_code == 0 and "mu/embed" in shown.output and "model" not in shown.output
    # a new step of the run, item by item; then stock Orbax restores it
    renamed = suture.transform([suture.rules.rename("embed", "embedder")], model)
    suture.save(renamed, tmp_path / "run", step=4, item="model")
    assert not [p for p in (tmp_path / "run").iterdir() if "tmp" in p.name]
    optimizer = suture.open(tmp_path / "run", step=3, item="optimizer")
    suture.save(optimizer, tmp_path / "run", step=4, item="optimizer")
    with pytest.raises(suture.SurgeryError, match="already has an item 'model'"):
        suture.save(renamed, tmp_path / "run", step=4, item="model")
    with ocp.CheckpointManager(tmp_path / "run", item_names=("model", "optimizer")) as manager:
        assert manager.all_steps() == [3, 4] and manager.latest_step() == 4
        restored = manager.restore(
            4,
            args=ocp.args.Composite(
                model=ocp.args.StandardRestore(), optimizer=ocp.args.StandardRestore()
            ),
        )
    np.testing.assert_array_equal(restored["model"]["embedder"]["embedding"], np.ones((4, 2)))
    assert int(restored["optimizer"]["step"]) == 3
    # a run folder that does not exist yet is created; a lone item is a manager's "default"
    suture.save({"w": np.ones(2, np.float32)}, tmp_path / "new" / "run", step=0)
    with ocp.CheckpointManager(tmp_path / "new" / "run") as manager:
        assert manager.latest_step() == 0
        assert manager.restore(0, args=ocp.args.StandardRestore())["w"].tolist() == [1.0, 1.0]


def test_demo_examples_writes_the_examples_checkpoints_once(tmp_path: Path) -> None:
    done = runner.invoke(app, ["demo", "--examples", str(tmp_path / "ex")])
    assert done.exit_code == 0, done.output
    for name in ("ckpt", "runs/my_model/checkpoints", "hf_model", "finetuned_a", "image_ckpt"):
        assert (tmp_path / "ex" / name).exists(), name
    assert suture.open(tmp_path / "ex" / "runs" / "my_model" / "checkpoints").step == 2000
    again = runner.invoke(app, ["demo", "--examples", str(tmp_path / "ex")])
    assert again.exit_code == 2 and "already holds ckpt" in again.output  # nothing replaced
