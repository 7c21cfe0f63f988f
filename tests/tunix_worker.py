"""Runs Tunix (google-tunix) beside suture, in Tunix's own environment, for tests/test_tunix.py.

google-tunix 0.1.7 pins safetensors<0.8, which takes transformers and safetensors below the
project's versions, so it lives in a virtual environment of its own (`tests/tunix_env.py`)
and the tests call this script there, with suture's sources on the path:

    python tests/tunix_worker.py load FAMILY HF_FOLDER OUT_DIR [MESH [SUTURE_FOLDER]]
        Loads HF_FOLDER with Tunix's create_model_from_safe_tensors and with
        suture.nnx.load_into (recipe FAMILY:tunix) into the same model class; compares every
        leaf; writes OUT_DIR/report.json and OUT_DIR/logits.npy (suture's model on TOKENS).
        SUTURE_FOLDER: suture loads this folder instead (the same model in transformers' fused
        expert layout, which Tunix's loader does not read).
    python tests/tunix_worker.py save FAMILY HF_FOLDER ROOT [LORA_RANK LORA_ALPHA]
        Loads HF_FOLDER with Tunix's loader, optionally wraps it with qwix LoRA (random, non-zero
        factors), scales the embedding by 2 (a stand-in for training), saves it with Tunix's
        CheckpointManager at step 3 under ROOT and writes ROOT/logits.npy (the model on TOKENS).
    python tests/tunix_worker.py preset NAME OUT_JSON
        The leaves (paths, shapes) of Tunix's Llama3 built from ModelConfig.NAME(), abstractly.
    python tests/tunix_worker.py sft FAMILY HF_FOLDER ROOT LORA_RANK LORA_ALPHA
        Three LoRA SFT steps with Tunix's PeftTrainer checkpointing to ROOT (the adapters
        alone, as the trainer saves a LoRA model), and ROOT/logits.npy of the trained model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

TOKENS = np.array([[1, 5, 9, 2, 33, 7, 60, 3]])


def tunix_model(family: str, config: dict):
    """(module of params, model class, ModelConfig) of Tunix's model for an HF config.json."""
    import jax.numpy as jnp

    if family == "gemma4":  # a multimodal folder's language model, as Tunix's loader reads it
        return _gemma4(config.get("text_config", config))
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    common = dict(
        num_layers=config["num_hidden_layers"],
        vocab_size=config["vocab_size"],
        embed_dim=config["hidden_size"],
        hidden_dim=config["intermediate_size"],
        num_heads=config["num_attention_heads"],
        head_dim=head_dim,
        num_kv_heads=config["num_key_value_heads"],
        rope_theta=int(config.get("rope_theta") or config["rope_parameters"].get("rope_theta", 0)),
        norm_eps=config["rms_norm_eps"],
    )
    tied = bool(config.get("tie_word_embeddings", False))
    if family == "llama3":
        from tunix.models.llama3 import model, params

        return params, model.Llama3, model.ModelConfig(**common, weight_tying=tied)
    if family == "llama3.2":  # Tunix's own Llama 3.2 preset (weight_tying=True), made tiny
        import dataclasses

        from tunix.models.llama3 import model, params

        return params, model.Llama3, dataclasses.replace(model.ModelConfig.llama3p2_1b(), **common)
    if family == "qwen3":
        from tunix.models.qwen3 import model, params

        cfg = model.ModelConfig(**common, use_tied_embedding=tied, dtype=jnp.float32)
        return params, model.Qwen3, cfg
    if family == "qwen3-moe":  # Tunix's Qwen3 with experts: its MLP width is the experts'
        from tunix.models.qwen3 import model, params

        cfg = model.ModelConfig(
            **{**common, "hidden_dim": config["moe_intermediate_size"]},
            use_tied_embedding=tied,
            num_experts=config.get("num_local_experts") or config["num_experts"],
            num_experts_per_tok=config["num_experts_per_tok"],
            dtype=jnp.float32,
        )
        return params, model.Qwen3, cfg
    if family in ("qwen2", "qwen2.5"):
        from tunix.models.qwen2 import model, params

        cfg = model.ModelConfig(**common, use_tied_embedding=tied, dtype=jnp.float32)
        return params, model.Qwen2, cfg
    if family == "gemma2":
        from tunix.models.gemma import model, params_safetensors

        cfg = model.ModelConfig(
            num_layers=config["num_hidden_layers"],
            num_embed=config["vocab_size"],
            embed_dim=config["hidden_size"],
            hidden_dim=config["intermediate_size"],
            num_heads=config["num_attention_heads"],
            head_dim=head_dim,
            num_kv_heads=config["num_key_value_heads"],
            final_logit_softcap=config["final_logit_softcapping"],
            use_post_attn_norm=True,
            use_post_ffw_norm=True,
            attention_types=(model.AttentionType.LOCAL_SLIDING, model.AttentionType.GLOBAL)
            * (config["num_hidden_layers"] // 2),
            attn_logits_soft_cap=config["attn_logit_softcapping"],
            sliding_window_size=config["sliding_window"],
        )
        return params_safetensors, model.Gemma, cfg
    if family == "gemma3":
        from tunix.models.gemma3 import model, params_safetensors

        cfg = model.ModelConfig(
            num_layers=config["num_hidden_layers"],
            num_embed=config["vocab_size"],
            embed_dim=config["hidden_size"],
            hidden_dim=config["intermediate_size"],
            num_heads=config["num_attention_heads"],
            head_dim=head_dim,
            num_kv_heads=config["num_key_value_heads"],
            sliding_window_size=config["sliding_window"],
            param_dtype=jnp.float32,
        )
        return params_safetensors, model.Gemma3, cfg
    raise SystemExit(f"no Tunix model for {family!r}")


def _gemma4(config: dict):
    """Tunix's Gemma4 for a Gemma 4 text config (31B- or 26B-A4B-like): its cycle from
    layer_types, the global layers' head size from per_layer_config, experts when it has them."""
    import jax.numpy as jnp
    from tunix.models.gemma4 import model, params_safetensors

    kinds = config["layer_types"]
    period = kinds.index("full_attention") + 1
    full = next(
        (
            entry
            for layer, entry in (config.get("per_layer_config") or {}).items()
            if int(layer) == period - 1
        ),
        {},
    )
    k_eq_v = bool(config.get("attention_k_eq_v"))
    moe = bool(config.get("enable_moe_block"))
    cfg = model.ModelConfig(
        num_layers=config["num_hidden_layers"],
        num_embed=config["vocab_size"],
        embed_dim=config["hidden_size"],
        hidden_dim=config["intermediate_size"],
        num_heads=config["num_attention_heads"],
        head_dim=config["head_dim"],
        num_kv_heads=config["num_key_value_heads"],
        num_global_kv_heads=full.get("num_key_value_heads") if k_eq_v else None,
        global_key_size=full.get("head_dim", config.get("global_head_dim", 512)),
        final_logit_softcap=config.get("final_logit_softcapping") or 30.0,
        sliding_window_size=config["sliding_window"],
        attention_pattern=(model.AttentionType.LOCAL_SLIDING,) * (period - 1)
        + (model.AttentionType.GLOBAL,),
        k_eq_v_global=k_eq_v,
        enable_moe=moe,
        num_experts=config.get("num_experts") if moe else None,
        num_experts_per_tok=config.get("top_k_experts") if moe else None,
        expert_dim=config.get("moe_intermediate_size") if moe else None,
        moe_dense_hidden_dim=config["intermediate_size"] if moe else None,
        param_dtype=jnp.float32,
        use_sliding_window_kv_cache=False,
    )
    return params_safetensors, model.Gemma4, cfg


def logits_of(model) -> np.ndarray:
    import jax.numpy as jnp

    tokens = jnp.asarray(TOKENS)
    positions = jnp.arange(tokens.shape[1])[None, :]
    mask = jnp.tril(jnp.ones((1, tokens.shape[1], tokens.shape[1]), dtype=bool))
    logits, _ = model(tokens, positions, None, mask)
    return np.asarray(logits, np.float32)


def load(family: str, hf: str, out: str, mesh_shape: str = "", ours_from: str = "") -> None:
    """`mesh_shape` ("2x2"): load on an (fsdp, tp) mesh of that many CPU devices, too;
    `ours_from`: the folder suture loads, when not `hf`."""
    import contextlib

    import jax
    from flax import nnx

    import suture

    config = json.loads((Path(hf) / "config.json").read_text())
    params, model_class, cfg = tunix_model(family, config)
    mesh = None
    if mesh_shape:
        sizes = tuple(int(n) for n in mesh_shape.split("x"))
        mesh = jax.make_mesh(sizes, ("fsdp", "tp"), devices=jax.devices()[: sizes[0] * sizes[1]])
    theirs = params.create_model_from_safe_tensors(hf, cfg, mesh=mesh)
    recipe = suture.families.get_recipe(f"{family}:tunix")
    # Tunix's habit (a model class, its config, a mesh) as suture.nnx.load_into takes it
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        abstract = nnx.eval_shape(lambda: model_class(cfg, rngs=nnx.Rngs(params=0)))
    ours = suture.nnx.load_into(
        abstract,
        ours_from or hf,
        transform=lambda tree: recipe.to_target(tree, config),
        mesh=mesh,
    )
    their_leaves = dict(nnx.to_flat_state(nnx.state(theirs)))
    our_leaves = dict(nnx.to_flat_state(nnx.state(ours)))
    differ = [
        "/".join(map(str, path))
        for path in their_leaves
        if path not in our_leaves
        or np.asarray(their_leaves[path][...]).dtype != np.asarray(our_leaves[path][...]).dtype
        or not np.array_equal(
            np.asarray(their_leaves[path][...]), np.asarray(our_leaves[path][...])
        )
    ]
    placed = [
        "/".join(map(str, path))
        for path in their_leaves
        if path in our_leaves
        and not their_leaves[path][...].sharding.is_equivalent_to(
            our_leaves[path][...].sharding, their_leaves[path][...].ndim
        )
    ]
    report = {
        "placed_differently": placed,
        "sharded": sum(not leaf[...].sharding.is_fully_replicated for leaf in our_leaves.values()),
        "leaves": len(their_leaves),
        "ours": len(our_leaves),
        "differ": differ,
        "paths": sorted("/".join(map(str, p)) for p in our_leaves),
    }
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "report.json").write_text(json.dumps(report))
    if mesh is None:  # sharded, Tunix's model needs its own sharding context to run
        np.save(Path(out) / "logits.npy", logits_of(ours))


def mixed(family: str, hf: str, out: str) -> None:
    """A folder of bfloat16 matrices and float32 norms: Tunix's default mode, Tunix's
    "original" mode and suture, into a float32 model."""
    import jax.numpy as jnp
    from flax import nnx

    import suture

    config = json.loads((Path(hf) / "config.json").read_text())
    params, model_class, cfg = tunix_model(family, config)
    report = {}
    try:
        params.create_model_from_safe_tensors(hf, cfg)
        report["tunix_default"] = "loaded"
    except Exception as error:  # what Tunix's default mode does with it, whatever it is
        report["tunix_default"] = f"{type(error).__name__}: {str(error)[:300]}"
    theirs = params.create_model_from_safe_tensors(hf, cfg, dtype=jnp.float32, mode="original")
    recipe = suture.families.get_recipe(f"{family}:tunix")
    ours = suture.nnx.load_into(
        nnx.eval_shape(lambda: model_class(cfg, rngs=nnx.Rngs(params=0))),
        hf,
        transform=lambda tree: recipe.to_target(tree, config),
    )
    their_leaves = dict(nnx.to_flat_state(nnx.state(theirs)))
    our_leaves = dict(nnx.to_flat_state(nnx.state(ours)))
    report["differ"] = [
        "/".join(map(str, path))
        for path, leaf in their_leaves.items()
        if not np.array_equal(np.asarray(leaf[...]), np.asarray(our_leaves[path][...]))
        or our_leaves[path][...].dtype != np.float32
    ]
    report["leaves"] = len(our_leaves)
    Path(out).write_text(json.dumps(report))


def mismatch(family: str, hf: str, out: str) -> None:
    """load_into a Tunix model whose config does not fit the folder (a wider MLP): the error."""
    import dataclasses

    from flax import nnx

    import suture

    config = json.loads((Path(hf) / "config.json").read_text())
    _, model_class, cfg = tunix_model(family, config)
    cfg = dataclasses.replace(cfg, hidden_dim=cfg.hidden_dim + 32)
    recipe = suture.families.get_recipe(f"{family}:tunix")
    try:
        suture.nnx.load_into(
            nnx.eval_shape(lambda: model_class(cfg, rngs=nnx.Rngs(params=0))),
            hf,
            transform=lambda tree: recipe.to_target(tree, config),
        )
    except suture.SurgeryError as error:
        Path(out).write_text(f"{type(error).__name__}: {error}")
    else:
        Path(out).write_text("loaded")


def preset(name: str, out: str) -> None:
    """Leaf paths and shapes of Tunix's Llama3 made (abstractly) from its preset
    ``ModelConfig.NAME()`` (``llama3p2_1b``, ``llama3p2_3b``), and the preset's weight tying."""
    from flax import nnx
    from tunix.models.llama3 import model

    cfg = getattr(model.ModelConfig, name)()
    abstract = nnx.eval_shape(lambda: model.Llama3(cfg, rngs=nnx.Rngs(params=0)))
    leaves = {
        "/".join(map(str, path)): list(variable.get_value().shape)
        for path, variable in nnx.to_flat_state(nnx.state(abstract))
    }
    Path(out).write_text(json.dumps({"weight_tying": cfg.weight_tying, "leaves": leaves}))


def save(
    family: str, hf: str, root: str, rank: str | None = None, alpha: str | None = None
) -> None:
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from tunix.sft.checkpoint_manager import CheckpointManager

    config = json.loads((Path(hf) / "config.json").read_text())
    params, _, cfg = tunix_model(family, config)
    model = params.create_model_from_safe_tensors(hf, cfg)
    if rank is not None:
        import qwix

        provider = qwix.LoraProvider(
            module_path=".*(q_proj|o_proj|gate_proj|down_proj)",
            rank=int(rank),
            alpha=float(alpha),
        )
        model = qwix.apply_lora_to_model(
            model, provider, rngs=nnx.Rngs(0), **model.get_model_input()
        )
        # qwix starts lora_b at zero; random factors make the merge show
        keys = iter(jax.random.split(jax.random.key(7), 1000))
        for _, variable in nnx.iter_graph(model):
            if isinstance(variable, nnx.LoRAParam):
                value = variable[...]
                variable[...] = 0.05 * jax.random.normal(next(keys), value.shape, value.dtype)
    model.embedder.input_embedding[...] = model.embedder.input_embedding[...] * jnp.float32(2)
    manager = CheckpointManager(root)
    assert manager.save(3, model, force=True)
    manager.close()
    np.save(Path(root) / "logits.npy", logits_of(model))


def sft(family: str, hf: str, root: str, rank: str, alpha: str) -> None:
    """A few LoRA SFT steps with Tunix's PeftTrainer, which checkpoints the adapters alone."""
    import jax.numpy as jnp
    import optax
    import qwix
    from flax import nnx
    from tunix.sft import peft_trainer

    config = json.loads((Path(hf) / "config.json").read_text())
    params, _, cfg = tunix_model(family, config)
    model = params.create_model_from_safe_tensors(hf, cfg)
    provider = qwix.LoraProvider(
        module_path=".*(q_proj|o_proj|gate_proj|down_proj)", rank=int(rank), alpha=float(alpha)
    )
    model = qwix.apply_lora_to_model(model, provider, rngs=nnx.Rngs(0), **model.get_model_input())

    def model_input(x: peft_trainer.TrainingInput) -> dict:
        length = x.input_tokens.shape[1]
        return {
            "input_tokens": x.input_tokens,
            "input_mask": x.input_mask,
            "positions": jnp.broadcast_to(jnp.arange(length), x.input_tokens.shape),
            "attention_mask": jnp.tril(jnp.ones((1, length, length), dtype=bool)),
        }

    rng = np.random.default_rng(0)
    batches = [
        peft_trainer.TrainingInput(
            input_tokens=rng.integers(0, config["vocab_size"], (2, 8)).astype(np.int32),
            input_mask=np.ones((2, 8), dtype=bool),
        )
        for _ in range(3)
    ]
    trainer = peft_trainer.PeftTrainer(
        model,
        optax.adam(1e-2),
        peft_trainer.TrainingConfig(
            eval_every_n_steps=100, max_steps=3, checkpoint_root_directory=root
        ),
    ).with_gen_model_input_fn(model_input)
    trainer.train(batches)
    np.save(Path(root) / "logits.npy", logits_of(model))


def docs(hf: str, out: str) -> None:
    """The Tunix block of docs/families.md as it is there, with the folder and Tunix's config
    of a tiny model in place of Qwen3-0.6B's; then its model's forward pass, on the mesh."""
    import re

    import jax

    page = (Path(__file__).resolve().parents[1] / "docs" / "families.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "tunix" in b]
    config = json.loads((Path(hf) / "config.json").read_text())
    block = re.sub(r"^folder = .*$", f"folder = {hf!r}", block, count=1, flags=re.M)
    block = re.sub(r"^tunix_config = .*$", "tunix_config = TINY", block, count=1, flags=re.M)
    namespace = {"TINY": tunix_model("qwen3", config)[2]}
    exec(compile(block, "families.md", "exec"), namespace)
    model, mesh = namespace["model"], namespace["mesh"]
    with jax.set_mesh(mesh):
        np.save(Path(out), logits_of(model))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    commands = {
        "load": load,
        "save": save,
        "sft": sft,
        "mismatch": mismatch,
        "mixed": mixed,
        "preset": preset,
        "docs": docs,
    }
    commands[command](*args)
