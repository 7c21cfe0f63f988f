"""suture: model surgery for JAX checkpoints.

Open checkpoints lazily, describe the result, and load it or stream it to disk while
reading only the bytes it needs.

Example:
    >>> import numpy as np, suture
    >>> ckpt = suture.open({"layer0": {"w": np.ones((2, 2))}, "layer1": {"w": np.zeros((2, 2))}})
    >>> stacked = suture.stack([ckpt["layer0/w"], ckpt["layer1/w"]])
    >>> stacked.shape
    (2, 2, 2)
"""

from ._starting import install_while_starting as _install_while_starting

_install_while_starting()  # first: `suture` stopped during its imports says so in one line

from importlib.metadata import version as _package_version

from . import linen as linen
from . import nnx as nnx
from . import optax as optax
from . import rules as rules
from ._convert import convert as convert
from ._errors import ArgumentError as ArgumentError
from ._errors import CheckpointNotFoundError as CheckpointNotFoundError
from ._errors import CollectiveError as CollectiveError
from ._errors import ConfigMismatchError as ConfigMismatchError
from ._errors import CorruptCheckpointError as CorruptCheckpointError
from ._errors import DestinationError as DestinationError
from ._errors import DestinationExistsError as DestinationExistsError
from ._errors import ExpressionError as ExpressionError
from ._errors import InvalidIndexError as InvalidIndexError
from ._errors import LossyCastError as LossyCastError
from ._errors import MergeError as MergeError
from ._errors import MissingLeafError as MissingLeafError
from ._errors import NotACheckpointError as NotACheckpointError
from ._errors import PathConflictError as PathConflictError
from ._errors import PatternError as PatternError
from ._errors import RecipeError as RecipeError
from ._errors import RuleError as RuleError
from ._errors import ShapeMismatchError as ShapeMismatchError
from ._errors import StaleLockWarning as StaleLockWarning
from ._errors import SurgeryError as SurgeryError
from ._errors import SutureWarning as SutureWarning
from ._errors import TransformError as TransformError
from ._errors import TreeMismatchError as TreeMismatchError
from ._errors import UnfinishedCheckpointError as UnfinishedCheckpointError
from ._errors import UnsupportedError as UnsupportedError
from ._iostats import count_bytes_read as count_bytes_read
from ._lazy.array import LazyArray as LazyArray
from ._lazy.array import map as map  # noqa: A004
from ._lazy.combine import concatenate as concatenate
from ._lazy.combine import stack as stack
from ._lazy.products import einsum as einsum
from ._lazy.products import matmul as matmul
from ._load.api import load as load
from ._load.api import load_and_transform as load_and_transform
from ._merge.api import merge as merge
from ._paths import flatten as flatten
from ._paths import unflatten as unflatten
from ._save.api import SaveHandle as SaveHandle
from ._save.api import SaveResult as SaveResult
from ._save.api import save as save
from ._save.mesh import TargetSharding as TargetSharding
from ._surgery.build import transform as transform
from ._surgery.orbax_transforms import Transform as Transform
from ._surgery.orbax_transforms import apply_transformations as apply_transformations
from ._surgery.orbax_transforms import intersect_trees as intersect_trees
from ._surgery.orbax_transforms import merge_trees as merge_trees
from ._surgery.plan import Plan as Plan
from ._surgery.plan import plan as plan
from ._surgery.targets import PLACEHOLDER as PLACEHOLDER
from ._surgery.targets import placeholders as placeholders
from .sources.checkpoint import Checkpoint as Checkpoint
from .sources.open import open as open  # noqa: A004

__version__ = _package_version("suture")

__all__ = [
    "apply_transformations",
    "ArgumentError",
    "Checkpoint",
    "CheckpointNotFoundError",
    "CollectiveError",
    "ConfigMismatchError",
    "CorruptCheckpointError",
    "DestinationError",
    "DestinationExistsError",
    "ExpressionError",
    "intersect_trees",
    "InvalidIndexError",
    "LazyArray",
    "merge_trees",
    "PLACEHOLDER",
    "Plan",
    "LossyCastError",
    "MergeError",
    "MissingLeafError",
    "NotACheckpointError",
    "PathConflictError",
    "PatternError",
    "RecipeError",
    "RuleError",
    "ShapeMismatchError",
    "SaveHandle",
    "SaveResult",
    "StaleLockWarning",
    "SurgeryError",
    "SutureWarning",
    "TargetSharding",
    "Transform",
    "TransformError",
    "TreeMismatchError",
    "UnfinishedCheckpointError",
    "UnsupportedError",
    "concatenate",
    "convert",
    "count_bytes_read",
    "einsum",
    "flatten",
    "load",
    "load_and_transform",
    "map",
    "matmul",
    "merge",
    "open",
    "plan",
    "placeholders",
    "linen",
    "nnx",
    "optax",
    "rules",
    "save",
    "stack",
    "transform",
    "unflatten",
]
