"""Hints for the command line: advice in its own terms, and arguments given in the wrong order.

Library errors speak of Python arguments (``partial=True``, ``init=``); `for_command_line`
says the same with the options the command line has, or what to do where it has none.
"""

from __future__ import annotations

import re
from pathlib import Path

from .._errors import ArgumentError

# Library advice about Python arguments, said as what a command-line user can do instead.
_COMMAND_LINE_WORDS = (
    (re.compile(r"[Pp]ass partial=True"), "pass --partial"),
    (  # the Python forms of init= (a Flax model's and optimizer's state) go with it
        re.compile(
            r"To create them, pass init= \(a tree of values or initializers;"
            r".*?nnx\.state\(optimizer\)\}\)"
        ),
        "You can create them with init = {...} in a Python recipe (there is no --init option)",
    ),
    (
        re.compile(r"(pass|name them in) init=( to create them)?"),
        "create them with init = {...} in a Python recipe (there is no --init option)",
    ),
    (re.compile(r"Pass target="), "Pass --target CHECKPOINT (or TARGET in a Python recipe)"),
    (re.compile(r"strict_casts=True"), "--strict-casts"),
    (
        re.compile(r"pass allow_lossy=True"),
        "reverse in Python with rules.reverse(..., allow_lossy=True) (no option here)",
    ),
    (re.compile(r"pad_truncate=True"), "a Python recipe that pads (suture.load's pad_truncate)"),
    (re.compile(r"Pass max_memory='(\w+)'"), r"Pass --max-memory \1"),
    # advice the command line has no flag for
    (re.compile(r" \(In Python, also: .*\.\)", re.S), ""),
)


def for_command_line(message: str) -> str:
    """`message` with advice about Python arguments turned into command-line options.

    Example:
        >>> for_command_line("Pass partial=True to drop them.")
        'pass --partial to drop them.'
    """
    for pattern, replacement in _COMMAND_LINE_WORDS:
        message = pattern.sub(replacement, message)
    return message


def family_recipe_hint(recipe: str, sources: list[str], command: str) -> str:
    """What to run instead when a built-in family recipe is given to `plan` or `apply`,
    which take rule recipes (files): `convert --recipe`, with `--dry-run` for a plan.

    Example:
        >>> print(family_recipe_hint("qwen3:maxtext", ["hf"], "plan"))
        'qwen3:maxtext' is a built-in family recipe, which `suture convert` runs; `suture plan` takes a recipe file of rules. Its plan: suture convert hf OUT --recipe qwen3:maxtext --dry-run
    """
    run = f"suture convert {sources[0] if sources else 'SOURCE'} OUT --recipe {recipe}"
    if command == "plan":
        run, what = f"{run} --dry-run", "Its plan"
    else:
        what = "Run it"
    return (
        f"{recipe!r} is a built-in family recipe, which `suture convert` runs; `suture "
        f"{command}` takes a recipe file of rules. {what}: {run}"
    )


RECIPE_SUFFIXES = (".py", ".yaml", ".yml", ".toml")


def check_recipe_first(recipe: str, sources: list[str], command: str) -> None:
    """A checkpoint given as the recipe (arguments swapped) gets a hint, not "does not exist"."""
    if Path(recipe).suffix.lower() in RECIPE_SUFFIXES or not Path(recipe).exists():
        return
    recipes = [source for source in sources if Path(source).suffix.lower() in RECIPE_SUFFIXES]
    if recipes:
        others = [source for source in sources if source not in recipes]
        order = " ".join([recipes[0], recipe, *others])
        raise ArgumentError(
            f"The arguments look swapped: {recipe!r} is a checkpoint and {recipes[0]!r} a "
            f"recipe. The recipe comes first: suture {command} {order} ..."
        )
    raise ArgumentError(
        f"{recipe!r} is a checkpoint, not a recipe file ({', '.join(RECIPE_SUFFIXES)}). The "
        f"recipe comes first, then the source checkpoint(s): suture {command} RECIPE SOURCE..."
    )
