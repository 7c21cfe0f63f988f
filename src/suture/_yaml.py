"""YAML read with bounds: every YAML file suture reads (rule recipes, family tables, merge
configs) comes through `parse`.

A YAML document can be tiny and still hostile: aliases that repeat aliases ("billion
laughs") expand to 9**9 nodes once loaded or walked, brackets nested thousands deep make
PyYAML's scanner quadratic and its composer recurse, and a sexagesimal integer
(``1:1:1:...``) takes quadratic time to build. So the text is capped in size and bracket
depth before parsing, and the composed graph (aliases still shared, nothing expanded) is
measured before anything is built from it: its depth and its node count as a loader would
expand them, an alias that contains itself, and the length of every integer.

Example:
    >>> from suture._errors import RecipeError
    >>> parse("rules: [{drop: a}]", "Recipe 'r.yaml'", "a recipe", RecipeError)[0]
    {'rules': [{'drop': 'a'}]}
"""

from __future__ import annotations

from typing import Any

from ._errors import SurgeryError

MAX_YAML_BYTES = 1 << 20  # a recipe, table or config is pages of text; a larger one is hostile
MAX_NESTING = 64  # levels; the deepest of suture's files nest five or six
MAX_YAML_NODES = 100_000  # after alias expansion: stops "billion laughs" documents
MAX_INT_DIGITS = 400  # an integer scalar: building a long sexagesimal one is quadratic


def parse(text: str, label: str, wanted: str, error: type[SurgeryError]) -> tuple[Any, Any]:
    """``(data, root node)`` of the YAML `text`, or `error` naming `label` (``"Recipe 'r.yaml'"``).

    `wanted` (``"a recipe"``) completes the messages: "nests too deeply to be a recipe". The
    root node (None for an empty document) keeps each value's line, for messages.
    """
    import yaml  # a format parser: loaded for YAML files only

    if len(text) > MAX_YAML_BYTES:
        raise error(
            f"{label} is over {MAX_YAML_BYTES // 1024} KiB; {wanted} is small. Check the path."
        )
    check_brackets(text, label, wanted, error)
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # its reader refuses control characters at once
        root = loader.get_single_node()
        if root is None:
            return None, None
        _check_graph(root, label, wanted, error)
        return loader.construct_document(root), root
    except yaml.YAMLError as failure:
        raise error(f"{label} is not valid YAML: {failure}") from None
    except RecursionError:
        raise error(_too_deep(label, wanted, None)) from None
    except (ValueError, TypeError, OverflowError) as failure:  # a scalar no Python value holds
        if isinstance(failure, SurgeryError):
            raise
        raise error(f"{label} is not valid YAML: {failure}.") from None
    finally:
        if loader is not None:
            loader.dispose()


def _too_deep(label: str, wanted: str, line: int | None) -> str:
    at = f", line {line}" if line is not None else ""
    return (
        f"{label}{at}: nests too deeply to be {wanted} (over {MAX_NESTING} levels); write it "
        f"flatter."
    )


def check_brackets(text: str, label: str, wanted: str, error: type[SurgeryError]) -> None:
    """Refuses brackets nested over `MAX_NESTING` deep, before a parser spends time on them.

    PyYAML's scanner is quadratic in the nesting depth (10 KB of ``[`` takes seconds) and
    its composer recurses; quoted text and comments are skipped.
    """
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return  # the common case: no need to look closer
    depth, quote, line, position = 0, "", 1, 0
    while position < len(text):
        char = text[position]
        if char == "\n":
            line += 1
        if quote:
            if char == "\\" and quote == '"':
                position += 1
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#":
            end = text.find("\n", position)
            position = len(text) if end < 0 else end - 1
        elif char in "[{":
            depth += 1
            if depth > MAX_NESTING:
                raise error(_too_deep(label, wanted, line))
        elif char in "]}":
            depth = max(0, depth - 1)
        position += 1


def _check_graph(root: Any, label: str, wanted: str, error: type[SurgeryError]) -> None:
    """Refuses a composed document that would expand past `MAX_YAML_NODES` nodes or
    `MAX_NESTING` levels, that contains itself, or that holds an overlong integer.

    Each distinct node is visited once (sizes and depths of shared nodes are remembered),
    so a billion-laughs document is measured in microseconds, never expanded.
    """
    import yaml  # a format parser: loaded for YAML files only

    sizes: dict[int, tuple[int, int]] = {}  # id -> (expanded node count, depth)
    open_nodes: set[int] = set()  # entered, children not yet measured: the current path
    pending: list[tuple[Any, bool]] = [(root, False)]
    while pending:
        node, finished = pending.pop()
        key = id(node)
        children = _children(node)
        if finished:
            open_nodes.discard(key)
            count = 1 + sum(sizes[id(child)][0] for child in children)
            depth = 1 + max((sizes[id(child)][1] for child in children), default=0)
            line = node.start_mark.line + 1
            if count > MAX_YAML_NODES:
                raise error(
                    f"{label} expands to over {MAX_YAML_NODES:,} YAML nodes (aliases repeating "
                    f"aliases?); {wanted} is far smaller. Refusing to expand it."
                )
            if depth > MAX_NESTING:
                raise error(_too_deep(label, wanted, line))
            sizes[key] = (count, depth)
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise error(
                f"{label}, line {node.start_mark.line + 1}: an alias refers to the value that "
                f"contains it, which would expand without end. Write the value out."
            )
        if (
            isinstance(node, yaml.ScalarNode)
            and node.tag == "tag:yaml.org,2002:int"
            and len(node.value) > MAX_INT_DIGITS
        ):
            raise error(
                f"{label}, line {node.start_mark.line + 1}: an integer of {len(node.value):,} "
                f"characters; {wanted} holds none over {MAX_INT_DIGITS}. Check the value."
            )
        open_nodes.add(key)
        pending.append((node, True))
        pending.extend((child, False) for child in children if id(child) not in sizes)


def _children(node: Any) -> list[Any]:
    import yaml  # a format parser: loaded for YAML files only

    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []
