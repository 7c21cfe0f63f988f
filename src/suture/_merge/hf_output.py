"""A merge written as a Hugging Face folder, as mergekit writes one.

Next to the safetensors (one ``model.safetensors``, or shards with
``model.safetensors.index.json``) the folder gets ``config.json`` from the base model (or
the first), with ``num_hidden_layers`` set to the layers written and ``dtype`` and
``torch_dtype`` to the output dtype; the tokenizer files of that model, copied as they are
(regular files only: a link is refused, so nothing outside the model folder is copied); and a
``README.md`` model card naming the method and models and holding the merge config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .._dtypes import to_dtype
from .._errors import MergeError
from .._hf import side_file
from .._json import loads as loads_json
from .._location import MAX_METADATA_BYTES, LocalLocation, location_of

TOKENIZER_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer.model",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)


def is_hf_folder(path: str | Path) -> bool:
    """Whether `path` (a folder, URL or cached Hub id) is a model folder with a ``config.json``."""
    folder = location_of(path)
    return folder.is_dir() and (folder / "config.json").is_file()


def hf_side_files(
    donor: str | Path,
    staging: Path,
    *,
    method: str,
    models: list[str],
    base: str | None,
    config_text: str,
    layers: int | None = None,
    out_dtype: str | None = None,
) -> dict[str, Any]:
    """The files to place next to the merged weights: ``{name: file}``.

    ``config.json`` and ``README.md`` are written into `staging`; tokenizer files are the
    donor's own (checked to be regular files inside the donor folder).
    """
    where = location_of(donor)
    folder: Any = where.path if isinstance(where, LocalLocation) else where
    files: dict[str, Any] = {}
    source_config = side_file(folder, "config.json")
    if source_config is None:
        raise MergeError(
            f"{str(folder / 'config.json')!r} is a link or not a regular file; suture reads "
            f"config.json only as a regular file inside the model folder. Replace the link with "
            f"the file itself."
        )
    raw = location_of(source_config).read_bytes(MAX_METADATA_BYTES, "the model's config")
    try:
        config = loads_json(raw.decode("utf-8"))
    except ValueError as error:  # UnicodeDecodeError is one
        raise MergeError(
            f"{str(source_config)!r} is not valid JSON ({error}); the merge copies the donor's "
            f"config.json beside its output. Mend or replace the donor's config.json."
        ) from error
    if not isinstance(config, dict):
        raise MergeError(
            f"{str(source_config)!r} holds {type(config).__name__}, not a JSON object; the "
            f"merge copies the donor's config.json beside its output. Mend or replace it."
        )
    if layers and "num_hidden_layers" in config:
        config["num_hidden_layers"] = layers
    if out_dtype:  # transformers 5 reads `dtype`, 4 `torch_dtype`; both by numpy's name
        config["dtype"] = config["torch_dtype"] = to_dtype(out_dtype).name
    config.pop("quantization_config", None)  # quantized models merge dequantized
    written = staging / "config.json"
    written.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    files["config.json"] = written
    for name in TOKENIZER_FILES:
        checked = side_file(folder, name)  # None (with a warning) for links and the like
        if checked is not None:
            files[name] = checked
    card = staging / "README.md"
    card.write_text(model_card(method, models, base, config_text), encoding="utf-8")
    files["README.md"] = card
    return files


def model_card(method: str, models: list[str], base: str | None, config_text: str) -> str:
    """A README.md for the merged model, in the shape of mergekit's card.

    Example:
        >>> print(model_card("linear", ["a", "b"], None, "merge_method: linear").splitlines()[1])
        base_model:
    """
    names = [Path(model).name for model in models]
    listed = "\n".join(f"- {name}" for name in names if base is None or name != Path(base).name)
    base_text = f", with {Path(base).name} as the base" if base else ""
    front = "\n".join(f"- {name}" for name in names)
    return f"""---
base_model:
{front}
library_name: transformers
tags:
- mergekit
- merge
- suture
---
# Merged model

This model was merged with suture from the models below.

## Merge Details
### Merge Method

This model was merged using the {method} merge method{base_text}.

### Models Merged

The following models were included in the merge:
{listed}

### Configuration

The following configuration was used to produce this model:

```yaml
{config_text.strip()}
```
"""
