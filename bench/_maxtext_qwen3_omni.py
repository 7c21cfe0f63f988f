"""MaxText's own converter with ``use_multimodal=True`` and ``use_audio=True`` beside suture's
``qwen3-omni:maxtext-unscanned`` (``python -m bench.families --maxtext-venv DIR
--maxtext-families --families qwen3-omni``).

A random transformers ``Qwen3OmniMoeForConditionalGeneration``, float32 and narrow (a 2-layer
MoE thinker; a 3-block vision tower with deepstack mergers after blocks 0 and 2; a 2-layer
audio encoder; the talker and code2wav of speech output, which both converters leave out), is
converted by MaxText 0.2.5's ``to_maxtext`` on its eager path (multimodal models refuse
``lazy_load_tensors``), as ``model_name=qwen3-omni-30b-a3b`` with the sizes overridden, and by
``suture convert --recipe qwen3-omni:maxtext-unscanned``; the trees are compared leaf by leaf, and
MaxText's own vision and audio encoders on suture's output are set beside transformers'. MaxText's qwen3-omni-30b-a3b is unscanned (deepstack needs ``scan_layers=False``). MaxText's
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

WORK = DATA_DIR / "families-maxtext-qwen3-omni"
MIB = 1024**2
RECIPES = ("qwen3-omni", "qwen3-omni:maxtext-unscanned")
TEXT = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    moe_intermediate_size=24,
    num_experts=4,
    num_experts_per_tok=2,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 1e6,
        "mrope_section": [4, 2, 2],
        "interleaved": True,
    },
)
VISION = dict(
    depth=3,
    hidden_size=32,
    intermediate_size=48,
    num_heads=4,
    patch_size=4,
    temporal_patch_size=2,
    spatial_merge_size=2,
    out_hidden_size=64,
    num_position_embeddings=16,
    deepstack_visual_indexes=[0, 2],
)
AUDIO = dict(
    num_mel_bins=16,
    encoder_layers=2,
    encoder_attention_heads=4,
    encoder_ffn_dim=48,
    d_model=32,
    output_dim=64,
    downsample_hidden_size=8,
    max_source_positions=64,
    n_window=50,
    n_window_infer=100,
    conv_chunksize=50,
)
SPEECH = dict(
    talker_config=dict(
        text_config=dict(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            moe_intermediate_size=8,
            num_experts=2,
            num_experts_per_tok=1,
            shared_expert_intermediate_size=8,
        ),
        code_predictor_config=dict(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            num_code_groups=2,
        ),
        thinker_hidden_size=64,
        accept_hidden_layer=1,
        num_code_groups=2,
        spatial_merge_size=2,  # transformers 5.24's talker reads it and its config lacks it
    ),
    code2wav_config=dict(
        codebook_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        num_quantizers=2,
        decoder_dim=16,
        upsample_rates=[2, 2],
        upsampling_ratios=[2, 2],
        sliding_window=8,
    ),
)


def settings() -> list[str]:
    layers = f"[{','.join(map(str, VISION['deepstack_visual_indexes']))}]"
    thinker = "hf_config.thinker_config"
    return [
        "model_name=qwen3-omni-30b-a3b",
        "override_model_config=True",
        f"base_emb_dim={TEXT['hidden_size']}",
        f"base_num_query_heads={TEXT['num_attention_heads']}",
        f"base_num_kv_heads={TEXT['num_key_value_heads']}",
        f"head_dim={TEXT['head_dim']}",
        f"base_mlp_dim={TEXT['moe_intermediate_size']}",
        f"base_moe_mlp_dim={TEXT['moe_intermediate_size']}",
        f"num_experts={TEXT['num_experts']}",
        f"num_experts_per_tok={TEXT['num_experts_per_tok']}",
        f"vocab_size={TEXT['vocab_size']}",
        f"base_num_decoder_layers={TEXT['num_hidden_layers']}",
        "logits_via_embedding=False",
        "mrope_section=[4,2,2]",
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
        "use_audio=True",
        f"d_model_for_audio={AUDIO['d_model']}",
        f"encoder_layers_for_audio={AUDIO['encoder_layers']}",
        f"encoder_attention_heads_for_audio={AUDIO['encoder_attention_heads']}",
        f"encoder_ffn_dim_for_audio={AUDIO['encoder_ffn_dim']}",
        f"num_mel_bins_for_audio={AUDIO['num_mel_bins']}",
        f"downsample_hidden_size_for_audio={AUDIO['downsample_hidden_size']}",
        f"output_dim_for_audio={AUDIO['output_dim']}",
        f"max_source_positions_for_audio={AUDIO['max_source_positions']}",
        f"n_window_for_audio={AUDIO['n_window']}",
        f"n_window_infer_for_audio={AUDIO['n_window_infer']}",
        f"conv_chunksize_for_audio={AUDIO['conv_chunksize']}",
        # its mapping counts layers and splits qkv from its built-in HF config: the folder's
        f"{thinker}.text_config.num_hidden_layers={TEXT['num_hidden_layers']}",
        f"{thinker}.text_config.num_experts={TEXT['num_experts']}",
        f"{thinker}.vision_config.depth={VISION['depth']}",
        f"{thinker}.vision_config.hidden_size={VISION['hidden_size']}",
        f"{thinker}.vision_config.num_heads={VISION['num_heads']}",
        f"{thinker}.vision_config.deepstack_visual_indexes={layers}",
        f"{thinker}.audio_config.encoder_layers={AUDIO['encoder_layers']}",
        f"{thinker}.audio_config.d_model={AUDIO['d_model']}",
        f"{thinker}.audio_config.encoder_attention_heads={AUDIO['encoder_attention_heads']}",
        "scan_layers=False",
    ]


def generate(folder: Path) -> int:
    """The random folder (norms and biases perturbed), with the talker and code2wav."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen3OmniMoeConfig(
        thinker_config=dict(text_config=TEXT, vision_config=VISION, audio_config=AUDIO),
        enable_audio_output=True,
        **SPEECH,
    )
    model = transformers.Qwen3OmniMoeForConditionalGeneration(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or "bias" in name or "ln_" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(folder)
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def compare(python: Path, *, timed: Callable[[list[str]], dict]) -> None:
    shutil.rmtree(WORK, ignore_errors=True)
    suture_cli = str(Path(sys.executable).with_name("suture"))
    rows, findings = [], []
    recipe = RECIPES[1]
    try:
        hf, ours, theirs = WORK / "hf", WORK / "suture", WORK / "mt"
        size = generate(hf)
        suture_run = timed(
            [suture_cli, "convert", str(hf), str(ours), "--recipe", recipe, "--no-progress"]
        )
        command = maxtext_command(python, settings(), hf, theirs, "float32")
        command += ["lazy_load_tensors=False", "eager_load_method=safetensors", "eager_numpy=True"]
        try:
            maxtext_run = timed(command)
        except RuntimeError as failed:
            findings.append(f"MaxText's converter failed: {str(failed)[-600:]}")
        else:
            lines, identical = compare_trees(theirs / "0" / "items", ours)
            vision = sum("vision_encoder" in path for path in identical)
            audio = sum("audio_encoder" in path for path in identical)
            rows.append((size, suture_run, maxtext_run, vision, audio))
            findings += lines
        findings += features_difference(python, hf, ours, WORK)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    body = report(rows, findings)
    write_section("families-maxtext-qwen3-omni", body)
    print(body)


def features_difference(python: Path, hf: Path, converted: Path, work: Path) -> list[str]:
    """MaxText's vision and audio encoders (its own model, float32, on the CPU) on suture's
    output beside transformers' ``get_image_features`` and ``get_audio_features`` on the HF
    folder, for one random image of 4 x 4 patches and 200 random mel frames (two of the audio
    encoder's 100-frame chunks; with ``n_window_infer`` 100 transformers attends within each
    chunk, as MaxText does): one line per output, its max abs difference and its scale."""
    import torch
    import transformers

    rng = np.random.default_rng(1)
    patch = VISION["temporal_patch_size"] * VISION["patch_size"] ** 2
    pixels = rng.standard_normal((16, 3 * patch)).astype(np.float32)
    mel = rng.standard_normal((1, AUDIO["num_mel_bins"], 200)).astype(np.float32)
    # MaxText's encoder reshapes its input (batch, C, T*P, H*P, W*P) into patches (-1, C, T, P,
    # P) in memory order: the processor's patches, in the processor's order, as it takes them
    side = 4 * VISION["patch_size"]
    np.save(work / "images.npy", pixels.reshape(1, 3, VISION["temporal_patch_size"], side, side))
    np.save(work / "audio.npy", mel)
    overrides = [item for item in settings() if not item.startswith("hf_config.")]
    done = subprocess.run(
        [
            str(python),
            "-P",
            str(BENCH_DIR / "_maxtext_omni_features.py"),
            str(work / "images.npy"),
            str(work / "audio.npy"),
            str(work),
            *overrides,
            f"load_parameters_path={converted}",
            f"base_output_directory={work / 'run'}",
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        return [f"MaxText's encoders failed on suture's output: {done.stderr[-600:]}"]
    model = transformers.Qwen3OmniMoeForConditionalGeneration.from_pretrained(
        hf, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        image = model.thinker.get_image_features(
            torch.from_numpy(pixels), torch.tensor([[1, 4, 4]])
        )
        audio = model.thinker.get_audio_features(
            torch.from_numpy(mel), feature_attention_mask=torch.ones((1, 200), dtype=torch.long)
        )
    pairs = {
        "merged image features": (image.pooler_output[0], np.load(work / "image.npy")),
        "deepstack features": (
            torch.stack([feature[0] for feature in image.deepstack_features]),
            np.load(work / "deepstack.npy"),
        ),
        "audio features": (audio.last_hidden_state, np.load(work / "audio.npy")),
    }
    lines = []
    for label, (expected, got) in pairs.items():
        expected = expected.numpy()
        if expected.size != got.size:
            lines.append(f"{label}: transformers {expected.shape}, MaxText {got.shape}")
            continue
        worst = float(np.max(np.abs(expected - got.reshape(expected.shape))))
        lines.append(
            f"MaxText's own model on suture's output beside transformers, {label} "
            f"{tuple(expected.shape)}: max abs difference {worst:.2e}, of values up to "
            f"{float(np.max(np.abs(expected))):.2f}"
        )
    return lines


def report(rows: list, findings: list[str]) -> str:
    def run(r: dict) -> str:
        return f"{r['wall_s']:.1f} s | {r['peak_rss_bytes'] / MIB:.0f} MiB |"

    table = "\n".join(
        f"| {size / MIB:.2f} MiB | {run(ours)} {run(theirs)} {vision} | {audio} |"
        for size, ours, theirs, vision, audio in rows
    )
    found = "\n".join(f"- {line}" for line in findings)
    return f"""## Multimodal: `qwen3-omni` beside MaxText's own converter with `use_multimodal=True`, `use_audio=True` (`python -m bench.families --maxtext-venv DIR --maxtext-families --families qwen3-omni`)

{machine()}, {date.today().isoformat()}. A random transformers
`Qwen3OmniMoeForConditionalGeneration` (float32; thinker language model: 2 layers, hidden 64, 4
query and 2 KV heads of 16, 4 experts of 24, vocab 256; vision tower: 3 blocks, hidden 32, 4
heads, MLP 48, patches 2 x 4 x 4, 16 positions, merge 2, deepstack mergers after blocks 0 and 2,
out 64; audio encoder: 16 mel bins, three 2-D convolutions of 8 channels, 2 layers, d_model 32,
4 heads, FFN 48, out 64; with speech output, so the folder also holds `talker.*` and
`code2wav.*`), converted by `suture convert --recipe qwen3-omni:maxtext-unscanned` and by
MaxText 0.2.5's `to_maxtext` (`model_name=qwen3-omni-30b-a3b` with the sizes overridden,
`use_multimodal=True`, `use_audio=True`, `scan_layers=False` as its model config has it, its
eager path `lazy_load_tensors=False` reading the safetensors files with numpy as MaxText's
environment has no torch; `save_dtype=float32`; its built-in HF config's layer counts, widths,
heads and deepstack layers set to the folder's). Both leave the talker and code2wav out.

| source | suture wall | suture peak RSS | MaxText wall | MaxText peak RSS | identical vision arrays | identical audio arrays |
| --- | --- | --- | --- | --- | --- | --- |
{table}

Output trees compared leaf by leaf (paths, shapes, dtypes, bytes; MaxText's empty `opt_state`
aside), then MaxText's own model (float32, on the CPU) restoring suture's output: its vision
encoder on one random image of 4 x 4 patches beside transformers' `get_image_features`, its audio
encoder on 200 random mel frames (two 100-frame chunks; `n_window_infer` 100, so transformers
attends within each chunk as MaxText does) beside `get_audio_features`
(`bench/_maxtext_omni_features.py`):

{found}
"""
