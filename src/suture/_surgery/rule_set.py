"""Every rule by name: the rules of `rules.py` and the reversible ones of `reversible.py`.

`suture.rules` re-exports this namespace; recipes look rule names up in it.
"""

from .reversible import Permute as Permute
from .reversible import Reshape as Reshape
from .reversible import Scale as Scale
from .reversible import Transpose as Transpose
from .reversible import permute as permute
from .reversible import reshape as reshape
from .reversible import reverse as reverse
from .reversible import scale as scale
from .reversible import transpose as transpose
from .rules import Cast as Cast
from .rules import Concat as Concat
from .rules import Drop as Drop
from .rules import Edit as Edit
from .rules import Keep as Keep
from .rules import MapValues as MapValues
from .rules import Match as Match
from .rules import Rename as Rename
from .rules import Rule as Rule
from .rules import RuleError as RuleError
from .rules import Split as Split
from .rules import Stack as Stack
from .rules import Unstack as Unstack
from .rules import apply_rules as apply_rules
from .rules import cast as cast
from .rules import concat as concat
from .rules import drop as drop
from .rules import keep as keep
from .rules import map_values as map_values
from .rules import rename as rename
from .rules import split as split
from .rules import stack as stack
from .rules import unstack as unstack

__all__ = [
    "Cast",
    "Concat",
    "Drop",
    "Edit",
    "Keep",
    "MapValues",
    "Match",
    "Permute",
    "Rename",
    "Reshape",
    "Rule",
    "RuleError",
    "Scale",
    "Split",
    "Stack",
    "Transpose",
    "Unstack",
    "apply_rules",
    "cast",
    "concat",
    "drop",
    "keep",
    "map_values",
    "permute",
    "rename",
    "reshape",
    "reverse",
    "scale",
    "split",
    "stack",
    "transpose",
    "unstack",
]
