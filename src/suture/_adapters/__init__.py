"""LoRA adapters: PEFT folders <-> JAX trees through the family recipes, and merges.

See `api` for the three entry points, `factors` for how a pair goes through a recipe's
operations, `peft_folder` for PEFT's files, and `pairs` for the JAX layouts read.
"""
