"""MaxText 0.2.5's own route for Kimi K2.6's INT4 checkpoints, run in MaxText's environment.

    MAXTEXT_VENV/bin/python bench/_kimi_maxtext.py SRC OUT LAYERS EXPERTS

Runs ``convert_deepseek_family_ckpt.py --model_size kimi-k2.6-text`` (its ``main``, as the
command line does) on `SRC`, a K2.6-shaped folder cut to `LAYERS` layers and `EXPERTS` routed
experts: the one change is those two counts in its ``kimi-k2.6-text`` entry (61 and 384), which
the script reads instead of the folder's config. It dequantizes each packed expert with its own
``dequantize_pack_quantized_int4`` as it loads every tensor, then stacks and saves with Orbax.
"""

from __future__ import annotations

import sys


def main() -> None:
    source, out, layers, experts = sys.argv[1:5]
    from maxtext.checkpoint_conversion.standalone_scripts import (
        convert_deepseek_family_ckpt as script,
    )

    script.MODEL_PARAMS_DICT["kimi-k2.6-text"].update(
        num_layers=int(layers), num_experts=int(experts)
    )
    sys.argv = [
        "convert_deepseek_family_ckpt.py",
        f"--base_model_path={source}",
        f"--maxtext_model_path={out}",
        "--model_size=kimi-k2.6-text",
    ]
    script.main()


if __name__ == "__main__":
    main()
