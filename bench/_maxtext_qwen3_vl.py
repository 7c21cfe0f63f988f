"""MaxText's own converter with ``use_multimodal=True`` beside suture's ``qwen3-vl`` recipes
(``python -m bench.families --maxtext-venv DIR --maxtext-families --families
qwen3-vl:maxtext-unscanned,qwen3-vl:maxtext,qwen3.5:maxtext-multimodal``), and
``qwen3.5:maxtext-multimodal`` on bench/_maxtext_families.py's Qwen3.5 folder.

Two random transformers models, a ``Qwen3VLForConditionalGeneration`` (dense) and a
``Qwen3VLMoeForConditionalGeneration`` (MoE), float32 and narrow (2 text layers; a 3-block
vision tower of width 32 with deepstack mergers after blocks 0 and 2), are converted by MaxText
0.2.5's ``to_maxtext`` on its eager path (multimodal models refuse ``lazy_load_tensors``) and by
``suture convert --recipe qwen3-vl:maxtext-unscanned``; the trees are compared leaf by leaf.
The MoE folder holds its experts as the published folders do (``gate_up_proj`` (E, H, 2I),
``down_proj`` (E, I, H)), the layout MaxText's Qwen3-VL hook reads. MaxText's deepstack needs
``scan_layers=False``: the scanned recipe is compared on a dense model without deepstack
(``deepstack_visual_indexes=[]``), where MaxText's converter scans the decoder. MaxText's
environment here has no torch: its eager loader reads the files with numpy
(``bench/_maxtext_convert.py``'s ``eager_numpy=True``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from datetime import date
from pathlib import Path

import numpy as np

from bench._common import BENCH_DIR, DATA_DIR, machine, write_section
from bench._maxtext import compare_trees, maxtext_command

WORK = DATA_DIR / "families-maxtext-qwen3-vl"
MIB = 1024**2
TEXT = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]},
)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, decoder_sparse_step=1)
VISION = dict(
    depth=3,
    hidden_size=32,
    intermediate_size=48,
    num_heads=4,
    out_hidden_size=64,
    patch_size=4,
    temporal_patch_size=2,
    spatial_merge_size=2,
    num_position_embeddings=16,
)
DEEPSTACK = [0, 2]
RECIPES = ("qwen3-vl:maxtext-unscanned", "qwen3-vl:maxtext", "qwen3.5:maxtext-multimodal")
# (label, MaxText model, MoE, deepstack layers, recipe, scanned)
CASES = (
    ("dense", "qwen3-vl-2b", False, DEEPSTACK, RECIPES[0]),
    ("MoE", "qwen3-vl-30b-a3b", True, DEEPSTACK, RECIPES[0]),
    ("dense, no deepstack", "qwen3-vl-2b", False, [], RECIPES[1]),
    ("Qwen3.5 MoE", "qwen3.5-35b-a3b", True, [], RECIPES[2]),
)
EXPERTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def settings(model_name: str, moe: bool, deepstack: list[int], scanned: bool) -> list[str]:
    layers = f"[{','.join(map(str, deepstack))}]"
    out = [
        f"model_name={model_name}",
        "override_model_config=True",
        f"base_emb_dim={TEXT['hidden_size']}",
        f"base_num_query_heads={TEXT['num_attention_heads']}",
        f"base_num_kv_heads={TEXT['num_key_value_heads']}",
        f"head_dim={TEXT['head_dim']}",
        f"base_mlp_dim={MOE['moe_intermediate_size'] if moe else TEXT['intermediate_size']}",
        f"vocab_size={TEXT['vocab_size']}",
        f"base_num_decoder_layers={TEXT['num_hidden_layers']}",
        "logits_via_embedding=False",
        "mrope_section=[4,2,2]",  # head_dim 16: 8 frequencies, as the folder's
        "use_multimodal=True",
        f"hidden_size_for_vit={VISION['hidden_size']}",
        f"intermediate_size_for_vit={VISION['intermediate_size']}",
        f"num_attention_heads_for_vit={VISION['num_heads']}",
        f"num_hidden_layers_for_vit={VISION['depth']}",
        f"patch_size_for_vit={VISION['patch_size']}",
        f"temporal_patch_size_for_vit={VISION['temporal_patch_size']}",
        f"spatial_merge_size_for_vit={VISION['spatial_merge_size']}",
        f"out_hidden_size_for_vit={VISION['out_hidden_size']}",
        f"num_position_embeddings_for_vit={VISION['num_position_embeddings']}",
        f"deepstack_visual_indexes_for_vit={layers}",
        "image_size_for_vit=16",
        # its mapping counts layers and splits qkv from its built-in HF config: set to the folder's
        f"hf_config.text_config.num_hidden_layers={TEXT['num_hidden_layers']}",
        f"hf_config.vision_config.depth={VISION['depth']}",
        f"hf_config.vision_config.hidden_size={VISION['hidden_size']}",
        f"hf_config.vision_config.deepstack_visual_indexes={layers}",
        f"scan_layers={scanned}",
    ]
    if moe:
        out += [
            f"num_experts={MOE['num_experts']}",
            f"num_experts_per_tok={MOE['num_experts_per_tok']}",
            f"base_moe_mlp_dim={MOE['moe_intermediate_size']}",
            f"hf_config.text_config.num_local_experts={MOE['num_experts']}",
        ]
    return out


def generate(folder: Path, moe: bool, deepstack: list[int]) -> int:
    """The random folder (norms, biases and experts perturbed), MoE experts as published."""
    import torch
    import transformers
    from safetensors.numpy import load_file, save_file

    torch.manual_seed(0)
    vision = {**VISION, "deepstack_visual_indexes": deepstack}
    if moe:
        config = transformers.Qwen3VLMoeConfig(vision_config=vision, text_config={**TEXT, **MOE})
        model = transformers.Qwen3VLMoeForConditionalGeneration(config)
    else:
        config = transformers.Qwen3VLConfig(vision_config=vision, text_config=TEXT)
        model = transformers.Qwen3VLForConditionalGeneration(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or "bias" in name or "experts" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(folder)
    for file in folder.glob("*.safetensors"):  # the experts' last two axes as published
        tensors = {
            name: np.ascontiguousarray(value.transpose(0, 2, 1))
            if name.endswith(EXPERTS)
            else value
            for name, value in load_file(file).items()
        }
        save_file(tensors, file, metadata={"format": "pt"})
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def compare(
    python: Path, *, timed: Callable[[list[str]], dict], only: list[str] | None = None
) -> None:
    """Converts each folder of the recipes in `only` (all when None) and writes the section."""
    shutil.rmtree(WORK, ignore_errors=True)
    suture_cli = str(Path(sys.executable).with_name("suture"))
    rows, findings = [], []
    try:
        for label, model_name, moe, deepstack, recipe in CASES:
            if only is not None and recipe not in only:
                continue
            if recipe == RECIPES[2]:
                rows_of, found = qwen35(python, timed, suture_cli)
                rows += rows_of
                findings += found
                continue
            work = WORK / label.replace(" ", "-").replace(",", "")
            hf, ours, theirs = work / "hf", work / "suture", work / "mt"
            size = generate(hf, moe, deepstack)
            suture_run = timed(
                [suture_cli, "convert", str(hf), str(ours), "--recipe", recipe, "--no-progress"]
            )
            scanned = recipe == "qwen3-vl:maxtext"
            command = maxtext_command(
                python, settings(model_name, moe, deepstack, scanned), hf, theirs, "float32"
            )
            command += [
                "lazy_load_tensors=False",
                "eager_load_method=safetensors",
                "eager_numpy=True",
            ]
            try:
                maxtext_run = timed(command)
            except RuntimeError as failed:
                findings.append(f"{label}: MaxText's converter failed: {str(failed)[-600:]}")
                continue
            lines, identical = compare_trees(theirs / "0" / "items", ours)
            tower = sum("vision_encoder" in path for path in identical)
            rows.append((label, recipe, size, suture_run, maxtext_run, tower))
            if deepstack:
                found = features_difference(python, hf, ours, work, model_name, moe, deepstack)
                findings.append(
                    f"{label}: MaxText's vision encoder and projector on suture's output beside "
                    f"transformers' get_image_features (merged features and {len(deepstack)} "
                    f"deepstack features): max abs difference {found[0]:.2e}, of features up "
                    f"to {found[1]:.2f}"
                )
            findings += [f"{label}: {line}" for line in lines]
            shutil.rmtree(work, ignore_errors=True)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    body = report(rows, findings)
    write_section("families-maxtext-qwen3-vl", body)
    print(body)


def qwen35(python: Path, timed: Callable[[list[str]], dict], suture_cli: str) -> tuple:
    """bench/_maxtext_families.py's Qwen3.5 folder (8 layers, 16 experts, a one-block vision
    tower of width 16) whole, beside MaxText's converter with ``use_multimodal=True``."""
    from bench import _maxtext_families

    family, model_name, kind, config, extra = next(
        entry for entry in _maxtext_families.FAMILIES if entry[0] == "qwen3.5"
    )
    work = WORK / "qwen3.5"
    hf, ours, theirs = work / "hf", work / "suture", work / "mt"
    size = _maxtext_families.generate(hf, kind, config)
    recipe = RECIPES[2]
    suture_run = timed(
        [suture_cli, "convert", str(hf), str(ours), "--recipe", recipe, "--no-progress"]
    )
    vision = [
        "use_multimodal=True",
        "hidden_size_for_vit=16",
        "intermediate_size_for_vit=24",
        "num_attention_heads_for_vit=2",
        "num_hidden_layers_for_vit=1",
        "patch_size_for_vit=4",
        "temporal_patch_size_for_vit=2",
        "spatial_merge_size_for_vit=2",
        f"out_hidden_size_for_vit={config['hidden_size']}",
        "num_position_embeddings_for_vit=2304",
        "hf_config.vision_config.depth=1",
        "hf_config.vision_config.hidden_size=16",
    ]
    settings_ = _maxtext_families.overrides(model_name, config, extra) + vision
    command = maxtext_command(python, settings_, hf, theirs, "float32")
    command += ["lazy_load_tensors=False", "eager_load_method=safetensors", "eager_numpy=True"]
    try:
        maxtext_run = timed(command)
    except RuntimeError as failed:
        return [], [f"Qwen3.5 MoE: MaxText's converter failed: {str(failed)[-600:]}"]
    lines, identical = compare_trees(theirs / "0" / "items", ours)
    tower = sum("vision_encoder" in path for path in identical)
    shutil.rmtree(work, ignore_errors=True)
    return [("Qwen3.5 MoE", recipe, size, suture_run, maxtext_run, tower)], [
        f"Qwen3.5 MoE: {line}" for line in lines
    ]


def features_difference(
    python: Path, hf: Path, converted: Path, work: Path, model_name: str, moe: bool, deepstack
) -> tuple[float, float]:
    """MaxText's vision encoder and projector (its own model, float32, on the CPU) on suture's
    output beside transformers' ``get_image_features`` on the HF folder, for one random image of
    4 x 4 patches: (max abs difference over the merged and deepstack features, their scale)."""
    import torch
    import transformers

    patch = VISION["temporal_patch_size"] * VISION["patch_size"] ** 2
    pixels = np.random.default_rng(1).standard_normal((16, 3 * patch)).astype(np.float32)
    # MaxText's encoder reshapes its input (batch, C, T*P, H*P, W*P) into patches (-1, C, T, P,
    # P) in memory order: the processor's patches, in the processor's order, as it takes them
    side = 4 * VISION["patch_size"]
    np.save(work / "images.npy", pixels.reshape(1, 3, VISION["temporal_patch_size"], side, side))
    overrides = [
        item
        for item in settings(model_name, moe, deepstack, False)
        if not item.startswith("hf_config.")
    ]
    done = subprocess.run(
        [
            str(python),
            "-P",
            str(BENCH_DIR / "_maxtext_image_features.py"),
            str(work / "images.npy"),
            str(work / "features.npy"),
            *overrides,
            f"load_parameters_path={converted}",
            f"base_output_directory={work / 'run'}",
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"MaxText's vision encoder failed:\n{done.stderr[-3000:]}")
    kind = "Qwen3VLMoeForConditionalGeneration" if moe else "Qwen3VLForConditionalGeneration"
    model = getattr(transformers, kind).from_pretrained(hf, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.get_image_features(torch.from_numpy(pixels), torch.tensor([[1, 4, 4]]))
    expected = [
        one.numpy().reshape(-1, VISION["out_hidden_size"])
        for one in _tensors(out.pooler_output) + _tensors(out.deepstack_features)
    ]
    got = [np.load(work / "features.npy")]
    got += list(np.load(work / "features-deepstack.npy"))
    got = [one.reshape(-1, VISION["out_hidden_size"]) for one in got]
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(got, expected, strict=True))
    return worst, max(float(np.max(np.abs(one))) for one in expected)


def _tensors(found) -> list:
    """The tensors of a (nested) tuple, in order: transformers gives one per image."""
    if isinstance(found, list | tuple):
        return [tensor for part in found for tensor in _tensors(part)]
    return [found]


def report(rows: list, findings: list[str]) -> str:
    def run(r: dict) -> str:
        return f"{r['wall_s']:.1f} s | {r['peak_rss_bytes'] / MIB:.0f} MiB |"

    table = "\n".join(
        f"| {label} | `{recipe}` | {size / MIB:.2f} MiB | {run(ours)} {run(theirs)} {tower} |"
        for label, recipe, size, ours, theirs, tower in rows
    )
    found = "\n".join(f"- {line}" for line in findings)
    return f"""## Multimodal: `qwen3-vl` beside MaxText's own converter with `use_multimodal=True` (`python -m bench.families --maxtext-venv DIR --maxtext-families --families qwen3-vl:maxtext-unscanned,qwen3-vl:maxtext,qwen3.5:maxtext-multimodal`)

{machine()}, {date.today().isoformat()}. Random transformers `Qwen3VLForConditionalGeneration`
and `Qwen3VLMoeForConditionalGeneration` (float32; language model: 2 layers, hidden 64, 4 query
and 2 KV heads of 16, MLP 96 or 4 experts of 24, vocab 256; vision tower: 3 blocks, hidden 32,
4 heads, MLP 48, patches 2 x 4 x 4, 16 positions, merge 2, deepstack mergers after blocks 0 and 2
(none in the scanned case), out 64), the MoE experts as published (`gate_up_proj` (E, H, 2I),
`down_proj` (E, I, H)), converted by `suture convert --recipe ...` and by MaxText 0.2.5's
`to_maxtext` (`model_name=qwen3-vl-2b` or `qwen3-vl-30b-a3b` with the sizes overridden,
`use_multimodal=True`, its eager path `lazy_load_tensors=False`, reading the safetensors files
with numpy as MaxText's environment has no torch; `save_dtype=float32`; its built-in HF config's
layer counts, vision width and deepstack layers set to the folder's). Deepstack requires
`scan_layers=False` in MaxText, so the scanned recipe is compared on a model without deepstack.
Qwen3.5: the folder of the `qwen3.5` row of `families-maxtext` (8 layers, 16 experts fused as
published, a one-block vision tower of width 16) whole, through `qwen3.5:maxtext-multimodal`
beside `model_name=qwen3.5-35b-a3b` with `use_multimodal=True` (scanned, as its text recipe).

| model | recipe | source | suture wall | suture peak RSS | MaxText wall | MaxText peak RSS | identical tower arrays |
| --- | --- | --- | --- | --- | --- | --- | --- |
{table}

Output trees compared leaf by leaf (paths, shapes, dtypes, bytes; MaxText's empty `opt_state`
aside):

{found}
"""
