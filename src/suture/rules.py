r"""Rules: small, ordered edits of a tree's '/' paths, applied lazily.

Every rule has a `pattern`, a regular expression that must match a *whole* path (as in
Orbax): a leaf's path, or the path of a subtree, which then applies to every leaf below it.
So ``rename("linear1", "layer1")`` moves the whole ``linear1`` subtree, while
``rename(r"layer(\d+)/kernel", r"block\1/w")`` renames single leaves. Replacement strings
take back-references (``\1``, ``\g<name>``).

Rules apply in order; leaves no rule touches pass through unchanged. A rule that matches
nothing is an error (``optional=True`` allows it), and so is a rule that writes a path another
rule wrote, or that the tree already holds.

Example:
    >>> import numpy as np, suture
    >>> from suture import rules
    >>> tree = {"linear1": {"w": np.ones(2)}, "linear2": {"w": np.zeros(2)}, "opt": {"mu": 1}}
    >>> result = rules.apply_rules(
    ...     [rules.drop("opt"), rules.stack(r"linear(?P<i>\d+)", into="layers", start=1)], tree
    ... )
    >>> result["layers"]["w"].shape
    (2, 2)
"""

from ._surgery import rule_set as _rule_set
from ._surgery.rule_set import *  # noqa: F403 (the names are listed once, in rule_set.__all__)

__all__ = _rule_set.__all__
