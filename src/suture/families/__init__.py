"""Built-in model-family recipes: Hugging Face <-> MaxText and Tunix layouts, both directions.

Each family is a YAML table in this package (copy one to make your own): for every MaxText
(or Tunix) leaf, its Hugging Face tensor and the invertible operations between them. The recipe reads
the model's ``config.json`` (head counts, head_dim, tied embeddings, GQA) and refuses a model
it does not fit, naming the field.

Example:
    >>> from suture import families
    >>> "llama3.1:maxtext" in families.recipe_names(), "qwen3:tunix" in families.recipe_names()
    (True, True)
"""

from ._expr import ExpressionError as ExpressionError
from ._multimodal import LeftOutWarning as LeftOutWarning
from ._ops import RecipeFormatError as RecipeFormatError
from ._recipe import ConfigMismatchError as ConfigMismatchError
from ._recipe import FamilyRecipe as FamilyRecipe
from ._tables import get_recipe as get_recipe
from ._tables import is_recipe_name as is_recipe_name
from ._tables import recipe_names as recipe_names

__all__ = [
    "ConfigMismatchError",
    "ExpressionError",
    "FamilyRecipe",
    "LeftOutWarning",
    "RecipeFormatError",
    "get_recipe",
    "is_recipe_name",
    "recipe_names",
]
