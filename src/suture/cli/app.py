"""The `suture` command line.

Errors on bad input print ``Error: <message>`` on stderr and exit with status 2, without
a traceback (``suture --debug ...`` shows it). Ctrl-C and SIGTERM stop a write within about
a block's time, remove its temporary output, and exit with 130 and 143.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import warnings
from collections.abc import Callable
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from .. import families
from .._convert import convert as run_convert
from .._convert import converted
from .._errors import ArgumentError, SutureWarning
from .._exec.memory import tune_malloc
from .._format import human_bytes
from .._interrupts import (
    Terminated,
    exit_promptly_when_done,
    finished_outputs,
    install_when_done,
    stopped_line,
    stopped_status,
)
from .._interrupts import install as install_interrupt_handlers
from .._redact import redact_text
from .._save.api import save
from .._save.mesh_reads import mesh_reads, render_mesh_reads, with_mesh_reads
from .._surgery.build import transform
from .._surgery.plan import lossy_casts, lossy_lines
from .._surgery.plan import plan as make_plan
from .._surgery.recipes import forward_record, load_recipe, reversed_rules, with_cast
from ..families._convert import check_options, convert_with_recipe, read_config
from ..families._file import family_recipe, is_family_recipe
from ..sinks.orbax import DEFAULT_COMPRESSION
from ..sources.open import open as open_checkpoint
from .chunks import render_chunks
from .demo import run_demo
from .diff import diff as run_diff
from .examples import write_examples
from .help import tidy_help
from .hints import RECIPE_SUFFIXES, check_recipe_first, family_recipe_hint, for_command_line
from .inspect import (
    collect_stats,
    describe,
    quantization_note,
    render_flat,
    render_stats,
    render_tree,
)
from .merge import run_merge
from .outcome import interruption_in, surgery_error_in
from .panels import ADAPTERS, FAMILIES, MEMORY_AND_SAFETY, OUTPUT, QUANTIZATION, in_panel
from .quiet import quiet_native_logs
from .reshard import Mesh, Sharding, run_reshard, target_of

app = typer.Typer(
    name="suture",
    help="Model surgery for JAX checkpoints: inspect, transform, load and stream them.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_state = {"debug": False}
F = TypeVar("F", bound=Callable[..., Any])

# Options that several commands share, declared once.
AllowPickle = Annotated[
    bool, typer.Option("--allow-pickle", help="Open PyTorch pickles (they can run code).")
]
AsJson = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the plan; write nothing.")]
MaxMemory = Annotated[
    str | None, typer.Option("--max-memory", help="Bytes in flight, e.g. 4GiB (default: 1GiB).")
]
MaxShardSize = Annotated[
    str | None, typer.Option("--max-shard-size", help="safetensors: shard size, e.g. 5GB.")
]
Output = Annotated[str, typer.Option("-o", "--output", help="Where to write the result.")]
OutputFormat = Annotated[
    str,
    typer.Option(
        "--format",
        help="orbax or safetensors (OUTPUT ending in .safetensors: one file; else a HF folder).",
    ),
]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace an existing output.")]
Partial = Annotated[bool, typer.Option("--partial", help="Drop leaves the target leaves out.")]
Progress = Annotated[bool | None, typer.Option("--progress/--no-progress", help="Progress bar.")]
Recipe = Annotated[str, typer.Argument(help="Recipe file (.py, .yaml, .toml).")]
Sources = Annotated[list[str], typer.Argument(help="Source checkpoint(s).")]
StrictCasts = Annotated[
    bool,
    typer.Option(
        "--strict-casts",
        help="A cast that changes a value beyond rounding (300.0 to int8, 1e5 to float16) is "
        "an error, and nothing is written. The plan lists such casts either way.",
    ),
]
Target = Annotated[
    str | None, typer.Option("--target", help="A checkpoint whose structure is the target.")
]
Verify = Annotated[
    bool, typer.Option("--verify", help="Read the result back and check it before committing.")
]
Compression = Annotated[
    str,
    typer.Option(
        "--compression",
        help="Orbax output: auto (the default: bit-shuffled LZ4 for 2-byte and wider "
        "numbers, as small as zstd for half its CPU; zstd for 1-byte types), zstd (Orbax's "
        "own, for every array) or none (chunks as they are: the least CPU, about a third "
        "more bytes for bfloat16).",
    ),
]
Dequantize = Annotated[
    bool,
    typer.Option(
        "--dequantize",
        help="Read quantized HF folders dequantized, in the same pass (FP8 block scales, "
        "MXFP4, DeepSeek-V4 FP4, compressed-tensors INT and NVFP4, ModelOpt NVFP4).",
    ),
]


def reports_errors(command: F) -> F:
    """Turns a SurgeryError into ``Error: ...`` on stderr and exit status 2, and Ctrl-C or
    SIGTERM into one line and exit status 130 or 143, also when another exception wraps them
    (`outcome`)."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except BaseException as failure:
            if isinstance(failure, typer.Exit | SystemExit):
                raise
            interruption = interruption_in(failure)
            if interruption is not None:
                raise typer.Exit(code=_say_stopped(interruption)) from None
            error = surgery_error_in(failure)
            if error is None or _state["debug"]:
                raise
            typer.echo(f"Error: {for_command_line(str(error))}", err=True)
            raise typer.Exit(code=2) from None

    return run  # type: ignore[return-value]


def _say_stopped(interruption: KeyboardInterrupt) -> int:
    """Prints the one line of an interrupted command; its exit status (130, SIGTERM 143)."""
    signum = signal.SIGTERM if isinstance(interruption, Terminated) else signal.SIGINT
    # it may land just after an output was put in place: that output is whole, and kept
    typer.echo(stopped_line(signum, finished_outputs()), err=True)
    return stopped_status(signum)


def _is_model_folder(source: str) -> bool:
    """Whether `source` is a local Hugging Face model folder (safetensors and config.json)."""
    folder = Path(source)
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _report_written(result: Any, verified: bool = False) -> None:
    typer.echo(
        f"Wrote {result.path} ({result.format}): {result.leaves} arrays, "
        f"{human_bytes(result.bytes_written)} in {result.seconds:.1f} s"
        + (", verified." if verified else ".")
    )


def _print_version(asked: bool) -> None:
    if asked:
        __version__ = package_version("suture")

        typer.echo(f"suture {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Model surgery for JAX checkpoints."""
    _state["debug"] = debug


@app.command()
@reports_errors
def inspect(
    path: Annotated[str, typer.Argument(help="Checkpoint folder or file.")],
    flat: Annotated[bool, typer.Option("--flat", help="One line per leaf, full paths.")] = False,
    as_json: AsJson = False,
    filter: Annotated[  # noqa: A002 (the option's name)
        str | None, typer.Option("--filter", help="Only leaves whose path matches this regex.")
    ] = None,
    depth: Annotated[
        int | None, typer.Option("--depth", min=1, help="Fold subtrees below this depth.")
    ] = None,
    step: Annotated[
        int | None, typer.Option("--step", help="CheckpointManager step (default: newest).")
    ] = None,
    item: Annotated[
        str | None, typer.Option("--item", help="One item of a CheckpointManager step (model).")
    ] = None,
    stats: Annotated[
        bool, typer.Option("--stats", help="Also min/max/mean/std/NaNs per leaf (reads the data).")
    ] = False,
    allow_pickle: AllowPickle = False,
    chunks: Annotated[
        bool,
        typer.Option(
            "--chunks",
            help="Each array's chunk grid; with --mesh and --sharding, the bytes a restore "
            "on that mesh reads per device against what it needs.",
        ),
    ] = False,
    mesh: Mesh = None,
    sharding: Sharding = None,
) -> None:
    """Show a checkpoint's leaves with shape, dtype and size. Reads no array data (but --stats)."""
    ckpt = open_checkpoint(path, step=step, item=item, allow_pickle=allow_pickle)
    if chunks or mesh is not None or sharding is not None:
        typer.echo(render_chunks(ckpt, filter, target_of(mesh, sharding)))
        return
    description = describe(ckpt, filter, logical=not stats)
    if stats:
        results = collect_stats(ckpt, description)
        typer.echo(
            description.to_json_text(results)
            if as_json
            else render_stats(description, results, depth)
        )
        return
    if as_json:
        typer.echo(description.to_json_text())
        return
    typer.echo(
        f"{ckpt.location}  ({ckpt.format}"
        + (f", step {ckpt.step})" if ckpt.step is not None else ")")
    )
    if "quantization_config" in ckpt.layout:
        typer.echo(quantization_note(ckpt.layout["quantization_config"], path))
    typer.echo(render_flat(description) if flat else render_tree(description, depth))


@app.command()
@reports_errors
def diff(
    a: Annotated[str, typer.Argument(help="First checkpoint.")],
    b: Annotated[str, typer.Argument(help="Second checkpoint.")],
    values: Annotated[
        bool, typer.Option("--values", help="Compare values too (reads both).")
    ] = False,
    atol: Annotated[float, typer.Option("--atol", help="Absolute tolerance for --values.")] = 0.0,
    rtol: Annotated[float, typer.Option("--rtol", help="Relative tolerance for --values.")] = 0.0,
    as_json: AsJson = False,
    allow_pickle: AllowPickle = False,
    ulp: Annotated[
        int,
        typer.Option(
            "--ulp",
            min=0,
            help="For --values: allow N units in the last place (the coarser dtype's).",
        ),
    ] = 0,
) -> None:
    """Show how two checkpoints differ. Exit 0 when equal, 1 when different, 2 on error."""
    first = open_checkpoint(a, allow_pickle=allow_pickle)
    second = open_checkpoint(b, allow_pickle=allow_pickle)
    result = run_diff(first, second, values=values, atol=atol, rtol=rtol, ulp=ulp)
    typer.echo(result.to_json() if as_json else str(result))
    raise typer.Exit(code=0 if result.equal else 1)


@app.command()
@reports_errors
def plan(
    recipe: Recipe,
    sources: Sources,
    target: Target = None,
    partial: Partial = False,
    as_json: AsJson = False,
    problems: Annotated[
        bool, typer.Option("--problems", help="Print only the problems (exit 2 if any).")
    ] = False,
    allow_pickle: AllowPickle = False,
    strict_casts: StrictCasts = False,
    dequantize: Dequantize = False,
    mesh: Annotated[
        str | None,
        typer.Option(
            "--mesh",
            help="A load onto this mesh (fsdp=8,tensor=2; with --sharding): the bytes each "
            "process reads against what its shards need.",
        ),
    ] = None,
    sharding: Sharding = None,
    processes: Annotated[
        int, typer.Option("--processes", min=1, help="With --mesh: the processes loading.")
    ] = 1,
) -> None:
    """Show what a recipe would do: outputs, sources, bytes. Reads and writes nothing.

    Problems (a pattern matching nothing, a bad regex, an unknown dtype) come first.
    """
    surgery = _prepare(recipe, sources, target, allow_pickle, "plan", dequantize)
    result = make_plan(
        surgery["transform"],
        *surgery["sources"],
        **surgery["arguments"],
        partial=partial,
        strict_casts=strict_casts,
    )
    on_mesh = target_of(mesh, sharding)
    reads = None
    if on_mesh is not None and result.ok:
        tree = transform(
            surgery["transform"], *surgery["sources"], **surgery["arguments"], partial=partial
        )
        reads = mesh_reads(tree, on_mesh, processes)
    shown = result.problems_text() if problems else str(result)
    if as_json:
        typer.echo(with_mesh_reads(result.to_json(), reads))
    else:
        typer.echo(for_command_line(shown))
        if reads is not None:
            typer.echo(render_mesh_reads(reads, on_mesh))  # type: ignore[arg-type]
    if not result.ok:
        raise typer.Exit(code=2)


@app.command()
@reports_errors
def apply(
    recipe: Recipe,
    sources: Sources,
    output: Output,
    format: OutputFormat = "orbax",  # noqa: A002
    dtype: Annotated[
        str | None, typer.Option("--dtype", help="Cast floating-point leaves.")
    ] = None,
    target: Target = None,
    partial: Partial = False,
    max_memory: MaxMemory = None,
    max_shard_size: MaxShardSize = None,
    overwrite: Overwrite = False,
    dry_run: DryRun = False,
    verify: Verify = False,
    compression: Compression = DEFAULT_COMPRESSION,
    allow_pickle: AllowPickle = False,
    progress: Progress = None,
    reverse: Annotated[
        bool, typer.Option("--reverse", help="Apply the recipe's rules backwards (rules.reverse).")
    ] = False,
    like: Annotated[
        str | None,
        typer.Option(
            "--like",
            help="With --reverse: the recipe's original input (for casts, reshapes, concats); "
            "default: the input the forward output records. Checked against that record.",
        ),
    ] = None,
    strict_casts: StrictCasts = False,
    dequantize: Dequantize = False,
) -> None:
    """Run a recipe on the source(s) and stream the result to OUTPUT.

    RECIPE is a YAML or TOML file with a list of rules (rename, drop, keep, stack, unstack,
    cast, concat, split, transpose, reshape, permute, scale: the guide's "Every rule" table
    shows each), or a Python file that defines RULES = [...] (suture.rules
    objects) or a function transform(*trees) taking one lazy tree per source.

    A Python recipe may also define TARGET, the tree to produce (arrays or
    jax.ShapeDtypeStruct leaves; --target takes it from a checkpoint instead), and init,
    the values of target leaves no source has: a tree of values, a tree of fn(shape, dtype)
    initializers, or a function of no arguments returning the new leaves (run under
    jax.jit; only the missing leaves are computed). A Python recipe is code: run only
    recipes you trust.
    """
    surgery = _prepare(recipe, sources, target, allow_pickle, "apply", dequantize)
    record = None
    if reverse:
        source = surgery["sources"][0] if len(surgery["sources"]) == 1 else None
        surgery["transform"] = reversed_rules(surgery["transform"], like, source)
    else:  # what the recipe read, for a later --reverse to check --like against
        record = forward_record(
            surgery["transform"], surgery["sources"], dtype, strict_casts, **surgery["arguments"]
        )
    steps = with_cast(surgery["transform"], dtype) if dtype is not None else surgery["transform"]
    arguments = {**surgery["arguments"], "partial": partial, "strict_casts": strict_casts}
    if dry_run:
        planned = make_plan(steps, *surgery["sources"], **arguments)
        typer.echo(for_command_line(str(planned)))
        if not planned.ok:  # as `suture plan` does: scripts can stop on a bad recipe
            raise typer.Exit(code=2)
        return
    tree = transform(steps, *surgery["sources"], **arguments)
    unchecked = [cast for cast in lossy_casts(tree) if not cast.checked]
    for line in lossy_lines(unchecked):  # as `suture plan` lists them
        typer.echo(f"Warning: {for_command_line(line)}", err=True)
    result = save(
        tree,
        output,
        format=format,
        overwrite=overwrite,
        max_memory=max_memory,
        max_shard_size=max_shard_size,
        progress=progress,
        verify=verify,
        compression=compression,
        metadata=record,
    )
    _report_written(result, verify)


def _prepare(
    recipe: str,
    sources: list[str],
    target: str | None,
    allow_pickle: bool,
    command: str,
    dequantize: bool = False,
) -> dict[str, Any]:
    if is_family_recipe(recipe) and Path(recipe).suffix.lower() not in RECIPE_SUFFIXES:
        raise ArgumentError(family_recipe_hint(recipe, sources, command))
    check_recipe_first(recipe, sources, command)
    loaded = load_recipe(recipe)
    opened = [
        open_checkpoint(source, allow_pickle=allow_pickle, dequantize=dequantize)
        for source in sources
    ]
    target_tree = open_checkpoint(target).abstract() if target is not None else loaded.target
    return {
        "transform": loaded.transform,
        "sources": opened,
        "arguments": {"target": target_tree, "init": loaded.init},
    }


@app.command("merge")
@reports_errors
def merge_command(
    config: Annotated[
        str,
        typer.Argument(help="Merge config (.yaml or .toml): suture's (method:) or mergekit's."),
    ],
    output: Output,
    format: Annotated[  # noqa: A002
        str | None,
        typer.Option(
            "--format",
            help="orbax or safetensors (default: safetensors for mergekit configs, else orbax).",
        ),
    ] = None,
    max_memory: MaxMemory = None,
    overwrite: Overwrite = False,
    dry_run: DryRun = False,
    verify: Verify = False,
    compression: Compression = DEFAULT_COMPRESSION,
    progress: Progress = None,
) -> None:
    """Merge several models (linear, slerp, ties, dare_ties, della ...) and stream the result.

    A mergekit config (merge_method:, models: or slices:) is read as it is; with Hugging Face
    folders as inputs and safetensors output, the output is a Hugging Face folder with
    config.json, the tokenizer files and a model card.
    """
    result = run_merge(
        config,
        output,
        format=format,
        max_memory=max_memory,
        overwrite=overwrite,
        dry_run=dry_run,
        verify=verify,
        compression=compression,
        progress=progress,
    )
    if isinstance(result, str):
        typer.echo(result)
    else:
        _report_written(result, verify)


@app.command()
@reports_errors
def convert(
    source: Annotated[str, typer.Argument(help="Checkpoint to read (any format suture opens).")],
    destination: Annotated[str, typer.Argument(help="Where to write it.")],
    format: Annotated[  # noqa: A002
        str | None,
        typer.Option(
            "--format",
            help="orbax or safetensors (default: from DESTINATION). safetensors to a path "
            "ending in .safetensors is one file; any other path is a Hugging Face folder.",
            rich_help_panel=OUTPUT,
        ),
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype", help="Cast floating-point leaves, e.g. bfloat16.", rich_help_panel=OUTPUT
        ),
    ] = None,
    recipe: Annotated[
        str | None,
        typer.Option(
            "--rules",
            "--recipe",
            help="A recipe file (.py, .yaml, .toml), or a built-in one such as "
            "llama3.1:maxtext (`suture recipes` lists them).",
            rich_help_panel=FAMILIES,
        ),
    ] = None,
    reverse: Annotated[
        bool,
        typer.Option(
            "--reverse",
            help="Run a built-in recipe backwards (MaxText or Tunix -> HF folder).",
            rich_help_panel=FAMILIES,
        ),
    ] = False,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            help="The model's config.json, for a built-in recipe.",
            rich_help_panel=FAMILIES,
        ),
    ] = None,
    mesh: in_panel(Mesh, OUTPUT) = None,
    sharding: in_panel(Sharding, OUTPUT) = None,
    max_memory: in_panel(MaxMemory, MEMORY_AND_SAFETY) = None,
    max_shard_size: in_panel(MaxShardSize, OUTPUT) = None,
    separator: Annotated[
        str,
        typer.Option("--separator", help="Joins keys into tensor names.", rich_help_panel=OUTPUT),
    ] = ".",
    overwrite: in_panel(Overwrite, OUTPUT) = False,
    dry_run: in_panel(DryRun, MEMORY_AND_SAFETY) = False,
    verify: in_panel(Verify, MEMORY_AND_SAFETY) = False,
    compression: in_panel(Compression, OUTPUT) = DEFAULT_COMPRESSION,
    keep_value_keys: Annotated[
        bool,
        typer.Option(
            "--keep-value-keys",
            help="safetensors of a Flax NNX state: keep its tensor names' .value.",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
    allow_pickle: in_panel(AllowPickle, MEMORY_AND_SAFETY) = False,
    progress: in_panel(Progress, OUTPUT) = None,
    strict_casts: in_panel(StrictCasts, MEMORY_AND_SAFETY) = False,
    dequantize: Annotated[
        bool,
        typer.Option(
            "--dequantize",
            help="Dequantize a quantized HF folder in the same pass (FP8 block scales, MXFP4, "
            "DeepSeek-V4 FP4, compressed-tensors INT and NVFP4, ModelOpt NVFP4), to --dtype "
            "(default bfloat16): an HF folder unless --format orbax; config.json loses its "
            "quantization_config.",
            rich_help_panel=QUANTIZATION,
        ),
    ] = False,
    quantize: Annotated[
        str | None,
        typer.Option(
            "--quantize",
            help="Linear weights in a serving format, a Hugging Face folder unless --format "
            "orbax: fp8-block (FP8 + a scale per 128x128 block, DeepSeek-V3's), or "
            "compressed-tensors' W4A16, W8A16, NVFP4A16, FP8_DYNAMIC (any case).",
            rich_help_panel=QUANTIZATION,
        ),
    ] = None,
    group_size: Annotated[
        int | None,
        typer.Option(
            "--group-size",
            help="With --quantize W4A16 or W8A16: input columns per scale (default 128).",
            rich_help_panel=QUANTIZATION,
        ),
    ] = None,
    keep_unquantized: Annotated[
        list[str] | None,
        typer.Option(
            "--keep-unquantized",
            help="With --quantize: a regex of tensor names kept in high precision (repeatable; "
            "replaces the defaults embed, norm, lm_head, routers).",
            rich_help_panel=QUANTIZATION,
        ),
    ] = None,
    like: Annotated[
        str | None,
        typer.Option(
            "--like",
            help="With --reverse: the original HF folder, whose config.json, tokenizer and "
            "generation files the output gets, and whose expert layout (per-expert or fused), "
            "cut vocabulary rows and vision tower it takes back.",
            rich_help_panel=FAMILIES,
        ),
    ] = None,
    lora_alpha: Annotated[
        float | None,
        typer.Option(
            "--lora-alpha",
            help="With a FAMILY:tunix recipe and --reverse: the LoRA alpha the checkpoint's "
            "adapters were trained with (merged as w + (a @ b) * alpha / rank; with "
            "--adapter-only, written as the PEFT folder's lora_alpha).",
            rich_help_panel=ADAPTERS,
        ),
    ] = None,
    adapter_only: Annotated[
        bool,
        typer.Option(
            "--adapter-only",
            help="With a built-in --recipe: the LoRA adapter alone. With --reverse, a JAX "
            "checkpoint's LoRA pairs (Flax NNX, qwix/Tunix) -> a PEFT folder; without, a "
            "PEFT folder (--config: the base's config.json) -> qwix factors.",
            rich_help_panel=ADAPTERS,
        ),
    ] = False,
    merge_adapter: Annotated[
        str | None,
        typer.Option(
            "--merge-adapter",
            help="A PEFT LoRA folder merged into the HF SOURCE as it streams (as peft's "
            "merge_and_unload): an HF folder, or with --recipe that layout.",
            rich_help_panel=ADAPTERS,
        ),
    ] = None,
) -> None:
    """Convert a checkpoint to Orbax or safetensors, streaming it.

    A Hugging Face folder converts to Orbax unless --format safetensors is given (or
    --quantize, whose serving layout is a Hugging Face folder's, or --dequantize, which gives
    the folder back in bfloat16 without its quantization_config); the Orbax checkpoint keeps
    the folder's files beside it, and converting it back with --format safetensors gives the
    folder again.
    """
    if dry_run:
        if adapter_only or merge_adapter is not None:
            raise ArgumentError("--dry-run does not plan --adapter-only or --merge-adapter.")
        if recipe is not None and is_family_recipe(recipe):
            check_options(
                recipe, reverse, format, quantize, keep_unquantized, group_size, destination
            )
            planned = convert_with_recipe(
                source,
                destination,
                recipe,
                reverse=reverse,
                config=config,
                dtype=dtype,
                like=like,
                dequantize=dequantize,
                lora_alpha=lora_alpha,
                # resolved as the run resolves it: a recipe without logical axes is refused
                target_sharding=target_of(mesh, sharding, recipe, takes_recipe=True),
                save_with=lambda tree, *_, **__: make_plan(None, tree, strict_casts=strict_casts),
            )
            typer.echo(for_command_line(str(planned)))
            if not planned.ok:
                raise typer.Exit(code=2)
            return
        tree, _ = converted(
            source,
            destination,
            format,
            dtype,
            recipe,
            reverse,
            config,
            separator,
            allow_pickle,
            max_shard_size,
            keep_value_keys,
            strict_casts=strict_casts,
            dequantize=dequantize,
            quantize=quantize,
        )
        planned = make_plan(None, tree, strict_casts=strict_casts)
        typer.echo(for_command_line(str(planned)))
        if not planned.ok:
            raise typer.Exit(code=2)
        return
    result = run_convert(
        source,
        destination,
        format=format,
        dtype=dtype,
        recipe=recipe,
        reverse=reverse,
        config=config,
        overwrite=overwrite,
        max_memory=max_memory,
        max_shard_size=max_shard_size,
        separator=separator,
        allow_pickle=allow_pickle,
        progress=progress,
        strict_casts=strict_casts,
        dequantize=dequantize,
        quantize=quantize,
        keep_unquantized=keep_unquantized,
        group_size=group_size,
        verify=verify,
        compression=compression,
        keep_value_keys=keep_value_keys,
        like=like,
        lora_alpha=lora_alpha,
        adapter_only=adapter_only,
        merge_adapter=merge_adapter,
        target_sharding=target_of(mesh, sharding, recipe, takes_recipe=True),
    )
    _report_written(result, verify)
    if result.format == "orbax" and _is_model_folder(source):
        typer.echo(
            f"{result.path} is an Orbax checkpoint, with {source}'s config and tokenizer files "
            f"beside it; transformers' from_pretrained reads a Hugging Face folder: pass "
            f"--format safetensors for one."
        )


@app.command()
@reports_errors
def reshard(
    source: Annotated[str, typer.Argument(help="Orbax checkpoint to rewrite (read only).")],
    destination: Annotated[str, typer.Argument(help="Where to write it.")],
    mesh: Mesh = None,
    sharding: Sharding = None,
    max_memory: MaxMemory = None,
    chunk_bytes: Annotated[
        str | None, typer.Option("--chunk-bytes", help="Largest chunk (default 16MiB).")
    ] = None,
    overwrite: Overwrite = False,
    verify: Verify = False,
    compression: Compression = DEFAULT_COMPRESSION,
    progress: Progress = None,
) -> None:
    """Rewrite an Orbax checkpoint with chunks that tile each array's shards on a mesh.

    Each host restoring it on that mesh then reads only chunks inside its own shards.
    Streamed within --max-memory whatever the checkpoint's size.
    """
    result = run_reshard(
        source,
        destination,
        mesh,
        sharding,
        max_memory=max_memory,
        chunk_bytes=chunk_bytes,
        overwrite=overwrite,
        verify=verify,
        compression=compression,
        progress=progress,
    )
    _report_written(result, verify)


@app.command()
@reports_errors
def recipes(
    name: Annotated[
        str | None, typer.Argument(help="Show one recipe's table for this config.json's model.")
    ] = None,
    config: Annotated[
        str | None, typer.Option("--config", help="config.json to show the operations for.")
    ] = None,
) -> None:
    """List the built-in model-family recipes (HF <-> MaxText, Tunix), or show one's operations."""
    if name is None:
        names = families.recipe_names()
        width = max(map(len, names), default=0) + 1  # the longest name still leaves a space
        for recipe_name in names:
            recipe = families.get_recipe(recipe_name)
            typer.echo(f"{recipe_name:{width}} {recipe.description}")
        return
    recipe = family_recipe(name)  # a built-in name, or a family table file
    table = recipe.operations_table(read_config(config)) if config is not None else []
    typer.echo(f"{recipe.name}: {recipe.description}\nFollows {recipe.follows}.")
    if recipe.layer_kinds():
        kinds = "; ".join(recipe.layer_kinds())
        typer.echo(
            f"Layer kinds the target fixes in code (a config.json that departs is refused): {kinds}."
        )
    for maxtext, hf, operations in table:
        typer.echo(f"  {maxtext:55} <- {hf:50} {operations}")


@app.command()
@reports_errors
def demo(
    workdir: Annotated[
        Path | None,
        typer.Option("--workdir", help="Where to write the demo checkpoint (default: a temp dir)."),
    ] = None,
    examples: Annotated[
        Path | None,
        typer.Option(
            "--examples",
            help="Instead: write the checkpoints the README's and the guide's examples name "
            "(ckpt, hf_model, ...) into this folder, and stop.",
        ),
    ] = None,
) -> None:
    """Write a small Flax model's checkpoint, then inspect, plan, stream and check a surgery.

    With --examples DIR, write the small checkpoints the README's and the guide's examples
    use into DIR instead: the examples run there as they are.
    """
    if examples is not None:
        write_examples(examples, echo=typer.echo)
        return
    run_demo(workdir, echo=typer.echo)


tidy_help(app)


def _show_warning(message: Any, category: type, *args: Any, **kwargs: Any) -> None:
    """suture's own warnings as one ``Warning: ...`` line; others as Python shows them."""
    if issubclass(category, SutureWarning):
        typer.echo(f"Warning: {redact_text(str(message))}", err=True)
    else:
        _python_show_warning(message, category, *args, **kwargs)


_python_show_warning = warnings.showwarning


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `suture` script and of ``python -m suture``."""
    warnings.showwarning = _show_warning
    args = argv if argv is not None else sys.argv[1:]
    # first, before any thread starts: the command line owns its process, one malloc arena
    tune_malloc()  # (docs/design.md, "Memory")
    if "--debug" not in args:
        quiet_native_logs()  # the AWS credential chain's misses, logged as errors
    install_interrupt_handlers()
    exit_promptly_when_done()
    try:
        app(args=args, prog_name="suture")
    except BaseException as ended:
        # an interrupt outside a command's body: typer turns it into a silent exit 130 (SIGTERM's
        # too) or, while it builds the command, lets it through; one inside a command's body
        # was reported already (raised `from None`)
        interruption = interruption_in(ended)
        if interruption is not None:
            code: Any = _say_stopped(interruption)
        else:
            code = ended.code if isinstance(ended, SystemExit) else 1
        if code in (130, 143):  # interrupted: the output is cleaned up; skip the
            sys.stdout.flush()  # libraries' exit handlers, which can take a second
            sys.stderr.flush()
            os._exit(code)
        install_when_done(code if isinstance(code, int) else 0 if code is None else 1)
        raise
