"""MaxText's own converter with ``use_multimodal=True`` beside suture's whole-model recipes
(``python -m bench.families --maxtext-venv DIR --maxtext-families --families
gemma3:maxtext-multimodal``).

One random transformers ``Gemma3ForConditionalGeneration`` (float32, narrow: 8 text layers, a
2-layer SigLIP tower of width 16 on 896x896 images in patches of 14, MaxText's 4096-row position
table) is converted by MaxText 0.2.5's ``to_maxtext`` on its eager path (multimodal models refuse
``lazy_load_tensors``) and by ``suture convert --recipe gemma3:maxtext-multimodal``; the two
trees are compared leaf by leaf. Then MaxText's own model restores suture's output and its
vision encoder and projector (``bench/_maxtext_image_features.py``) turn a random 896x896 image
into soft tokens, set beside transformers' ``get_image_features``, and its whole forward pass
(``bench/_maxtext_multimodal_logits.py``: the soft tokens placed in a prompt, the decoder) gives
logits set beside transformers'. MaxText's environment here
has no torch, so its eager
safetensors loader reads the files with numpy (``bench/_maxtext_convert.py``'s
``eager_numpy=True``): the same tensors by the same names. The folder keeps the tower under
``model.vision_tower.vision_model.``, the names MaxText's mapping reads (transformers 5.24 saves
``model.vision_tower.``, which MaxText renames only on its transformers loading path).
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

WORK = DATA_DIR / "families-maxtext-multimodal"
MIB = 1024**2
TEXT = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=32,
    num_hidden_layers=8,  # one period of 6 and 2 left over
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    query_pre_attn_scalar=16,
    # wider than an image's 256 soft tokens, as Gemma 3's 1024: transformers' sliding layers
    # let image tokens see each other only within the window, MaxText's across the image
    sliding_window=264,
    rms_norm_eps=1e-6,
)
# MaxText builds its model on a dummy image of GEMMA_DEFAULT_IMAGE_SIZE = 896 pixels whatever
# image_size_for_vit says: the tower must take 896x896 images, here in patches of 14
VISION = dict(
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=896,
    patch_size=14,
    vision_use_head=False,  # as Google's folders: SigLIP's pooling head is no part of Gemma 3
)
SETTINGS = [
    "model_name=gemma3-4b",
    "override_model_config=True",
    "base_emb_dim=64",
    "base_num_query_heads=4",
    "base_num_kv_heads=2",
    "head_dim=16",
    "base_mlp_dim=32",
    "vocab_size=256",
    "base_num_decoder_layers=8",
    "use_multimodal=True",
    "hidden_size_for_vit=16",
    "intermediate_size_for_vit=24",
    "num_hidden_layers_for_vit=2",
    "num_attention_heads_for_vit=2",
    # its mapping counts layers, and its embedding hook takes sqrt(hidden_size), from its
    # built-in HF config of gemma3-4b: set to the folder's
    "hf_config.text_config.num_hidden_layers=8",
    "hf_config.text_config.hidden_size=64",
    "hf_config.vision_config.num_hidden_layers=2",
    "scan_layers=True",
]
RECIPES = ("gemma3:maxtext-multimodal", "gemma4:maxtext-multimodal")


def generate(folder: Path) -> int:
    """The random multimodal Gemma 3 folder (norms and biases perturbed); its bytes."""
    import torch
    import transformers
    from safetensors.numpy import load_file, save_file

    torch.manual_seed(0)
    config = transformers.Gemma3Config(
        text_config=TEXT, vision_config=VISION, mm_tokens_per_image=256
    )
    model = transformers.Gemma3ForConditionalGeneration(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            # the projector starts as zeros: random, so that the image features show
            if "norm" in name or "bias" in name or "projection" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
        # on bfloat16's grid: MaxText's tied logits (attend_on_embedding) cast the table to
        # bfloat16 whatever the model's dtype
        table = model.get_input_embeddings().weight
        table.copy_(table.to(torch.bfloat16).to(table.dtype))
    model.save_pretrained(folder, save_original_format=False)
    for file in folder.glob("*.safetensors"):  # the tower under MaxText's mapping's names
        old, new = "model.vision_tower.", "model.vision_tower.vision_model."
        tensors = {
            new + name[len(old) :] if name.startswith(old) else name: value
            for name, value in load_file(file).items()
        }
        save_file(tensors, file, metadata={"format": "pt"})
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def compare(
    python: Path, *, timed: Callable[[list[str]], dict], recipes: tuple[str, ...] = RECIPES
) -> None:
    """Runs the whole-model recipes named in `recipes`, each in its own section."""
    if RECIPES[0] in recipes:
        compare_gemma3(python, timed=timed)
    if RECIPES[1] in recipes:
        from bench import _maxtext_multimodal_gemma4

        _maxtext_multimodal_gemma4.compare(python, timed=timed)


def compare_gemma3(python: Path, *, timed: Callable[[list[str]], dict]) -> None:
    """Converts the folder both ways and writes the section."""
    shutil.rmtree(WORK, ignore_errors=True)
    suture_cli = str(Path(sys.executable).with_name("suture"))
    recipe = RECIPES[0]
    try:
        hf, ours, theirs = WORK / "hf", WORK / "suture", WORK / "mt"
        size = generate(hf)
        suture_run = timed(
            [suture_cli, "convert", str(hf), str(ours), "--recipe", recipe, "--no-progress"]
        )
        command = maxtext_command(python, SETTINGS, hf, theirs, save_dtype="float32")
        command += ["lazy_load_tensors=False", "eager_load_method=safetensors", "eager_numpy=True"]
        maxtext_run = timed(command)
        lines, identical = compare_trees(theirs / "0" / "items", ours)
        tower = sum("vision_encoder" in path for path in identical)
        features = features_difference(python, hf, ours, WORK)
        logits = logits_difference(python, hf, ours, WORK)
        body = report(recipe, size, suture_run, maxtext_run, lines, tower, features, logits)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    write_section("families-maxtext-multimodal", body)
    print(body)


def features_difference(python: Path, hf: Path, converted: Path, work: Path) -> tuple:
    """MaxText's vision encoder and projector on suture's output against transformers'
    ``get_image_features`` on the HF folder, for one random image: (max abs difference, scale)."""
    import torch
    import transformers

    images = np.random.default_rng(1).standard_normal((1, 896, 896, 3)).astype(np.float32)
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
    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(hf, dtype=torch.float32)
    with torch.no_grad():
        pixels = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()  # NHWC -> NCHW
        expected = model.eval().get_image_features(pixels)
    expected = getattr(expected, "pooler_output", expected).numpy()
    got = np.load(work / "features.npy").reshape(expected.shape)
    return float(np.max(np.abs(got - expected))), float(np.max(np.abs(expected)))


# Gemma 3's image soft token: MaxText's GEMMA_TOKEN_PLACEHOLDER, HF's image_token_id
IMAGE_TOKEN = 262144
# the forward pass only: the folder's sliding window, and global rotary positions unscaled as
# in the folder's config (MaxText's gemma3-4b scales them by 8)
FORWARD = [f"sliding_window_size={TEXT['sliding_window']}", "rope_linear_scaling_factor=1.0"]


def logits_difference(python: Path, hf: Path, converted: Path, work: Path) -> tuple:
    """MaxText's whole multimodal forward pass on suture's output against transformers' on the
    HF folder, for one random 896x896 image and a prompt with its 256 soft tokens between text
    tokens, and enough text after it that the sliding window shows: (max abs difference, scale)."""
    import torch
    import transformers

    rng = np.random.default_rng(2)
    images = rng.standard_normal((1, 896, 896, 3)).astype(np.float32)
    text = rng.integers(1, TEXT["vocab_size"], size=8 + 300)
    tokens = np.concatenate([text[:8], np.full(256, IMAGE_TOKEN), text[8:]])[None].astype(np.int32)
    np.save(work / "images.npy", images)
    np.save(work / "tokens.npy", tokens)
    settings = [item for item in SETTINGS if not item.startswith("hf_config.")] + FORWARD
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
    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(hf, dtype=torch.float32)
    ids = torch.from_numpy(tokens).long()
    with torch.no_grad():
        expected = model.eval()(
            input_ids=ids,
            pixel_values=torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(),
            token_type_ids=(ids == IMAGE_TOKEN).long(),  # the image's tokens see each other
        ).logits.numpy()
    got = np.load(work / "logits.npy").reshape(expected.shape)
    return float(np.max(np.abs(got - expected))), float(np.max(np.abs(expected)))


def report(
    recipe,
    size,
    ours: dict,
    theirs: dict,
    lines: list[str],
    tower: int,
    features: tuple,
    logits: tuple,
) -> str:
    def run(r: dict) -> str:
        return f"{r['wall_s']:.1f} s | {r['peak_rss_bytes'] / MIB:.0f} MiB |"

    found = "\n".join(f"- {line}" for line in lines)
    return f"""## Multimodal: `{recipe}` beside MaxText's own converter with `use_multimodal=True` (`python -m bench.families --maxtext-venv DIR --maxtext-families --families {recipe}`)

{machine()}, {date.today().isoformat()}. One random transformers `Gemma3ForConditionalGeneration`
(float32; language model: 8 layers, hidden 64, 4 query and 2 KV heads of 16, MLP 32, vocab 256;
SigLIP tower: 2 layers, hidden 16, 2 heads, MLP 24, 896x896 images in patches of 14, so MaxText's
4096-row position table; projector 16 -> 64), converted by `suture convert --recipe {recipe}`
and by MaxText 0.2.5's `to_maxtext` (`model_name=gemma3-4b` with the sizes overridden,
`use_multimodal=True`, `scan_layers=True`, its eager path `lazy_load_tensors=False`, which
multimodal models need, reading the safetensors files with numpy as MaxText's environment has
no torch; `save_dtype=float32`; its built-in HF config's layer counts and text hidden size set to
the folder's, so that its embedding factor is sqrt(64) as suture's).

| recipe | source | suture wall | suture peak RSS | MaxText wall | MaxText peak RSS |
| --- | --- | --- | --- | --- | --- |
| `{recipe}` | {size / MIB:.1f} MiB | {run(ours)} {run(theirs)}

Output trees compared leaf by leaf (paths, shapes, dtypes, bytes; MaxText's empty `opt_state`
aside): {tower} of the identical arrays are the vision tower's and projector's
(`vision_encoder/...`, unscanned in both).

{found}

MaxText's own model (float32, highest matmul precision, on the CPU;
`bench/_maxtext_image_features.py`) restores suture's output through `load_parameters_path`,
and its vision encoder and projector (`Transformer.vision_encoder`: the SigLIP tower, the
pooling to 256 soft tokens, the soft-embedding norm and the projection) turn one random 896x896
image into soft tokens; transformers' `get_image_features` on the HF folder gives the same:
max abs difference {features[0]:.3g} (largest value {features[1]:.3g}).

The whole multimodal forward pass runs too (`bench/_maxtext_multimodal_logits.py`: MaxText's
`Transformer` with `encoder_images`, float32, on the CPU): a prompt of 8 text tokens, the image's
256 soft tokens (MaxText's placeholder 262144, transformers' `image_token_id`) and 300 text
tokens, one random 896x896 image. MaxText's model on suture's output and transformers'
`Gemma3ForConditionalGeneration` on the HF folder (with `token_type_ids` marking the image, so
that its tokens attend to each other both ways, as MaxText's `bidirectional_mask` makes them)
give the same logits: max abs difference {logits[0]:.3g} (largest value {logits[1]:.3g}).

The folder's embedding table is on bfloat16's grid, as MaxText's tied logits
(`attend_on_embedding`) cast the table to bfloat16 whatever the model's dtype (with a float32
table off that grid the logits differ by about 1e-3 from the first token on). The sliding window
is 264, wider than an image: where it is narrower, transformers' sliding layers let an image's
tokens see each other only within the window and MaxText's across the whole image, and the two
models differ (not so for Gemma 3's window of 1024). The forward pass takes the folder's window
and unscaled global rotary positions (`sliding_window_size=264`,
`rope_linear_scaling_factor=1.0`; MaxText's gemma3-4b scales them by 8, which the random folder
does not).

MaxText builds its Gemma 3 tower on a dummy image of 896x896 pixels (`GEMMA_DEFAULT_IMAGE_SIZE`)
whatever `image_size_for_vit` says, so a tower MaxText's model loads has (896 // patch)^2
position rows: a tiny test model needs `image_size=896` (patches of 14 here), or its table will
not fit MaxText's model even where the converter copies it.
"""
