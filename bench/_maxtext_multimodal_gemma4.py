"""``gemma4:maxtext-multimodal`` beside MaxText's own converter with ``use_multimodal=True``
(``python -m bench.families --maxtext-venv DIR --maxtext-families --families
gemma4:maxtext-multimodal``).

One random transformers ``Gemma4ForConditionalGeneration`` (float32; the language model 26B-A4B's
kind: one block of 5 local and 1 global layer, 4 experts, 2 per token, a shared expert, the global
layer's keys its values; a 2-layer vision tower of width 32 in patches of 16, pooled 3x3, with
``standardize`` as MaxText's gemma4-26b mapping reads ``std_scale``/``std_bias`` always) is converted by MaxText 0.2.5's ``to_maxtext`` on its eager
path and by ``suture convert --recipe gemma4:maxtext-multimodal``; the two trees are compared
leaf by leaf. Then MaxText's own model restores suture's output and its vision encoder and
projector (``bench/_maxtext_image_features.py``) turn a random image into soft tokens, set beside
transformers' ``get_image_features`` on the same patches, and its whole forward pass
(``bench/_maxtext_multimodal_logits.py``: the soft tokens placed in a prompt, the decoder) gives
logits set beside transformers'.
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

WORK = DATA_DIR / "families-maxtext-multimodal-gemma4"
MIB = 1024**2

RECIPE = "gemma4:maxtext-multimodal"
TEXT = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=32,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    global_head_dim=32,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    hidden_size_per_layer_input=0,
    enable_moe_block=True,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=16,
    final_logit_softcapping=30.0,
    sliding_window=1024,
    # an image's tokens attend to each other both ways in sliding layers, as MaxText's gemma4
    # always makes them; transformers' default (None) keeps them causal
    use_bidirectional_attention="vision",
)
VISION = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
    position_embedding_size=64,
    patch_size=16,
    pooling_kernel_size=3,
    standardize=True,
)
# MaxText builds its Gemma 4 tower on a dummy image of 672x960 pixels (processor_gemma4's
# GEMMA4_IMAGE_HEIGHT/WIDTH) whatever image_size_for_vit says, and pools to vision_output_length
# (280 for gemma4-26b): the image here is that size, 42x60 patches of 16 pooled into 280
IMAGE = (672, 960)
SETTINGS = [
    "model_name=gemma4-26b",
    "override_model_config=True",
    "base_emb_dim=64",
    "base_num_query_heads=4",
    "base_num_kv_heads=2",
    "head_dim=16",
    "global_head_dim=32",
    "global_num_kv_heads=1",
    "base_mlp_dim=32",
    "base_moe_mlp_dim=16",
    "num_experts=4",
    "num_experts_per_tok=2",
    "vocab_size=256",
    "base_num_decoder_layers=6",
    "sparse_matmul=False",
    "use_multimodal=True",
    "hidden_size_for_vit=32",
    "intermediate_size_for_vit=48",
    "num_hidden_layers_for_vit=2",
    "num_attention_heads_for_vit=2",
    "num_position_embeddings_for_vit=64",
    # its mapping counts layers and experts, and its embedding hook takes sqrt(hidden_size),
    # from its built-in HF config of gemma4-26b: set to the folder's
    "hf_config.text_config.num_hidden_layers=6",
    "hf_config.text_config.hidden_size=64",
    "hf_config.text_config.num_experts=4",
    "hf_config.vision_config.num_hidden_layers=2",
    "scan_layers=True",
]


def generate(folder: Path) -> int:
    """The random multimodal Gemma 4 folder (every tensor perturbed); its bytes."""
    import torch
    import transformers

    config = transformers.Gemma4Config(text_config=TEXT, vision_config=VISION, audio_config=None)
    torch.manual_seed(0)
    model = transformers.Gemma4ForConditionalGeneration(config)
    with torch.no_grad():  # no two tensors alike, so that a wrong mapping shows
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
        for name, buffer in model.named_buffers():
            if name.endswith(("layer_scalar", "std_scale", "std_bias")):
                buffer.add_(torch.randn_like(buffer) * 0.1)
        table = model.get_input_embeddings().weight  # on bfloat16's grid: MaxText's tied
        table.copy_(table.to(torch.bfloat16).to(table.dtype))  # logits round the table to it
    model.save_pretrained(folder)
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def patches(images: np.ndarray, patch: int) -> tuple[np.ndarray, np.ndarray]:
    """(batch, H, W, C) images as Gemma 4's processor gives them: (batch, patches, p*p*C) in
    row-major patch order, each patch (p, p, C) flattened, and the patches' (x, y)."""
    b, h, w, c = images.shape
    grid = images.reshape(b, h // patch, patch, w // patch, patch, c).transpose(0, 1, 3, 2, 4, 5)
    x, y = np.meshgrid(np.arange(w // patch), np.arange(h // patch))
    positions = np.broadcast_to(np.stack([x, y], -1).reshape(1, -1, 2), (b, x.size, 2))
    return grid.reshape(b, -1, patch * patch * c), positions


def features_difference(python: Path, hf: Path, converted: Path, work: Path) -> tuple:
    """MaxText's vision encoder and projector on suture's output against transformers'
    ``get_image_features`` on the HF folder, for one random image: (max abs difference, scale)."""
    import torch
    import transformers

    images = np.random.default_rng(1).random((1, *IMAGE, 3)).astype(np.float32)
    np.save(work / "images.npy", images)
    settings = [item for item in SETTINGS if not item.startswith("hf_config.")]
    done = subprocess.run(
        [
            str(python),
            "-P",
            str(BENCH_DIR / "_maxtext_image_features.py"),
            str(work / "images.npy"),
            str(work / "features.npy"),
            *settings,
            f"load_parameters_path={converted}",
            f"base_output_directory={work / 'run'}",
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"MaxText's vision encoder failed:\n{done.stderr[-3000:]}")
    model = transformers.Gemma4ForConditionalGeneration.from_pretrained(hf, dtype=torch.float32)
    pixels, positions = patches(images, VISION["patch_size"])
    with torch.no_grad():
        out = model.eval().get_image_features(
            torch.from_numpy(pixels.copy()), torch.from_numpy(positions.copy()).long()
        )
    expected = torch.cat(list(out.pooler_output)).numpy()
    got = np.load(work / "features.npy").reshape(expected.shape)
    return float(np.max(np.abs(got - expected))), float(np.max(np.abs(expected)))


IMAGE_TOKEN = 258880  # MaxText's GEMMA4_TOKEN_PLACEHOLDER, HF's image_token_id
SOFT_TOKENS = 280  # vision_output_length: 42x60 patches pooled 3x3


def logits_difference(python: Path, hf: Path, converted: Path, work: Path) -> tuple:
    """MaxText's whole multimodal forward pass on suture's output against transformers' on the
    HF folder, for one random 672x960 image and a prompt with its 280 soft tokens between text
    tokens: (max abs difference, scale)."""
    import torch
    import transformers

    rng = np.random.default_rng(2)
    images = rng.random((1, *IMAGE, 3)).astype(np.float32)
    text = rng.integers(1, TEXT["vocab_size"], size=8 + 40)
    tokens = np.concatenate([text[:8], np.full(SOFT_TOKENS, IMAGE_TOKEN), text[8:]])[None]
    np.save(work / "images.npy", images)
    np.save(work / "tokens.npy", tokens.astype(np.int32))
    settings = [item for item in SETTINGS if not item.startswith("hf_config.")]
    done = subprocess.run(
        [
            str(python),
            "-P",
            str(BENCH_DIR / "_maxtext_multimodal_logits.py"),
            str(work / "images.npy"),
            str(work / "tokens.npy"),
            str(work / "logits.npy"),
            *settings,
            f"load_parameters_path={converted}",
            f"base_output_directory={work / 'run'}",
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"MaxText's multimodal forward pass failed:\n{done.stderr[-3000:]}")
    model = transformers.Gemma4ForConditionalGeneration.from_pretrained(hf, dtype=torch.float32)
    pixels, positions = patches(images, VISION["patch_size"])
    ids = torch.from_numpy(tokens).long()
    with torch.no_grad():
        expected = model.eval()(
            input_ids=ids,
            pixel_values=torch.from_numpy(pixels.copy()),
            image_position_ids=torch.from_numpy(positions.copy()).long(),
            mm_token_type_ids=(ids == IMAGE_TOKEN).long(),
        ).logits.numpy()
    got = np.load(work / "logits.npy").reshape(expected.shape)
    return float(np.max(np.abs(got - expected))), float(np.max(np.abs(expected)))


def compare(python: Path, *, timed: Callable[[list[str]], dict]) -> None:
    """Converts the folder both ways and writes the section."""
    shutil.rmtree(WORK, ignore_errors=True)
    suture_cli = str(Path(sys.executable).with_name("suture"))
    try:
        hf, ours, theirs = WORK / "hf", WORK / "suture", WORK / "mt"
        size = generate(hf)
        suture_run = timed(
            [suture_cli, "convert", str(hf), str(ours), "--recipe", RECIPE, "--no-progress"]
        )
        command = maxtext_command(python, SETTINGS, hf, theirs, save_dtype="float32")
        command += ["lazy_load_tensors=False", "eager_load_method=safetensors", "eager_numpy=True"]
        maxtext_run = timed(command)
        lines, identical = compare_trees(theirs / "0" / "items", ours)
        tower = sum("vision_encoder" in path for path in identical)
        features = features_difference(python, hf, ours, WORK)
        logits = logits_difference(python, hf, ours, WORK)
        body = report(size, suture_run, maxtext_run, lines, tower, features, logits)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    write_section("families-maxtext-multimodal-gemma4", body)
    print(body)


def report(
    size, ours: dict, theirs: dict, lines: list[str], tower: int, features: tuple, logits: tuple
) -> str:
    def run(r: dict) -> str:
        return f"{r['wall_s']:.1f} s | {r['peak_rss_bytes'] / MIB:.0f} MiB |"

    found = "\n".join(f"- {line}" for line in lines)
    return f"""## Multimodal: `{RECIPE}` beside MaxText's own converter with `use_multimodal=True` (`python -m bench.families --maxtext-venv DIR --maxtext-families --families {RECIPE}`)

{machine()}, {date.today().isoformat()}. One random transformers `Gemma4ForConditionalGeneration`
(float32; language model of 26B-A4B's kind: 6 layers, one block of 5 local and 1 global, hidden
64, 4 query and 2 KV heads of 16, the global layer's head size 32 with 1 KV head and keys = values,
4 experts of 16 (2 per token) and a shared expert of 32, vocab 256; vision tower: 2 layers, hidden
32, 2 heads of 16, MLP 48, patches of 16, a 64-row position table, `standardize` on; projector
32 -> 64), converted by `suture convert --recipe {RECIPE}` and by MaxText 0.2.5's `to_maxtext`
(`model_name=gemma4-26b` with the sizes overridden, `use_multimodal=True`, `scan_layers=True`,
its eager path `lazy_load_tensors=False` reading the safetensors files with numpy;
`save_dtype=float32`; its built-in HF config's layer counts, expert count and text hidden size
set to the folder's).

| recipe | source | suture wall | suture peak RSS | MaxText wall | MaxText peak RSS |
| --- | --- | --- | --- | --- | --- |
| `{RECIPE}` | {size / MIB:.1f} MiB | {run(ours)} {run(theirs)}

Output trees compared leaf by leaf (paths, shapes, dtypes, bytes; MaxText's empty `opt_state`
aside): {tower} of the identical arrays are the vision tower's and projector's
(`vision_encoder/...`, unscanned in both; the position table permuted (1, 0, 2)).

{found}

MaxText's own model (float32, highest matmul precision, on the CPU;
`bench/_maxtext_image_features.py`) restores suture's output through `load_parameters_path`,
and its vision encoder and projector (`Gemma4VisionEncoderLayer_0`: patches, the factorized
position table, 2-D rotary attention, 3x3 pooling to 280 soft tokens, the standardization; then
`Gemma4VisionProjector_0`) turn one random 672x960 image into soft tokens; transformers'
`get_image_features` on the same patches of the HF folder gives the same: max abs difference
{features[0]:.3g} (largest value {features[1]:.3g}).

The whole multimodal forward pass runs too (`bench/_maxtext_multimodal_logits.py`: MaxText's
`Transformer` with `encoder_images`, float32, on the CPU): a prompt of 8 text tokens, the image's
280 soft tokens (MaxText's placeholder 258880, transformers' `image_token_id`) and 40 text
tokens. MaxText's model on suture's output and transformers' `Gemma4ForConditionalGeneration` on
the HF folder (with `mm_token_type_ids` marking the image) give the same logits: max abs
difference {logits[0]:.3g} (largest value {logits[1]:.3g}). The folder's text config has
`use_bidirectional_attention: vision`: MaxText's gemma4 layers always let an image's tokens
attend to each other both ways in sliding layers, transformers' only with that setting (its
default keeps them causal, and the logits then differ from the first image token on, by about
the logits' own size). The embedding table is on bfloat16's grid, as MaxText's tied logits cast
the table to bfloat16.

MaxText builds its Gemma 4 tower on a dummy image of 672x960 pixels
(`GEMMA4_IMAGE_HEIGHT/WIDTH`) whatever `image_size_for_vit` says, and pools it to
`vision_output_length` soft tokens: a tower MaxText's model builds takes patches whose grid fits
its position table (here 42x60 patches of 16, table of 64 rows) and pools to that length. Its
gemma4-26b/31b mapping reads `std_scale`/`std_bias` always, so its converter fails on a folder
without `standardize`, for which suture makes them (ones and zeros, as MaxText's gemma4-small
hook does). The E2B/E4B towers are not converted: MaxText 0.2.5's gemma4-small mapping marks
its vision part "not yet supported" and has no audio tower.
"""
