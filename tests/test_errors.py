"""One error family: every error suture exports is a SurgeryError and a Python kind.

Each kind of mistake has one class, defined in `suture._errors`, and each is raised by a
real bad input below.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from safetensors.numpy import save_file

import suture
from suture import _errors
from suture._exec.distributed import Group
from suture._patterns import compile_pattern
from suture._surgery.recipes import load_recipe

EXPORTED = {
    name: value
    for name, value in vars(suture).items()
    if isinstance(value, type)
    and issubclass(value, BaseException)
    and not issubclass(value, Warning)
}
WARNINGS = {
    name: value
    for name, value in vars(suture).items()
    if isinstance(value, type) and issubclass(value, Warning)
}


def test_every_exported_error_is_a_surgery_error_and_a_python_kind():
    assert set(EXPORTED) >= {"SurgeryError", "RuleError", "TransformError", "MergeError"}
    for name, error in EXPORTED.items():
        assert name in suture.__all__, name
        assert issubclass(error, suture.SurgeryError), name
        assert issubclass(error, ValueError), name  # a value the user gave is wrong


def test_every_error_class_of_suture_is_defined_in_errors_and_exported():
    defined = {
        value
        for value in vars(_errors).values()
        if inspect.isclass(value) and issubclass(value, BaseException)
    }
    assert defined == set(EXPORTED.values()) | set(WARNINGS.values())
    assert all(issubclass(warning, suture.SutureWarning) for warning in WARNINGS.values())
    assert all(error.__module__ == "suture._errors" for error in defined)


def test_old_names_still_catch():
    assert suture.TransformError is suture.RuleError is suture.rules.RuleError
    from suture._merge.api import MergeError
    from suture._surgery.recipe_schema import SchemaError

    assert MergeError is suture.MergeError
    assert SchemaError is suture.RecipeError
    assert issubclass(suture.CheckpointNotFoundError, FileNotFoundError)
    assert issubclass(suture.MissingLeafError, KeyError)
    assert issubclass(suture.InvalidIndexError, IndexError)
    assert suture.families.ConfigMismatchError is suture.ConfigMismatchError
    assert suture.families.RecipeFormatError is suture.RecipeError
    assert issubclass(suture.ExpressionError, suture.RecipeError)
    assert issubclass(suture.DestinationError, OSError)
    assert issubclass(suture.DestinationExistsError, suture.DestinationError)
    assert issubclass(suture.DestinationExistsError, FileExistsError)


@pytest.fixture
def ckpt():
    return suture.open({"a": {"w": np.ones((2, 3), np.float32)}})


def test_checkpoint_not_found(tmp_path):
    with pytest.raises(suture.CheckpointNotFoundError, match=r"No such file or folder"):
        suture.open(tmp_path / "missing")


def test_not_a_checkpoint(tmp_path):
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(suture.NotACheckpointError, match=r"is not a checkpoint: found readme"):
        suture.open(tmp_path)


def test_unfinished_checkpoint(tmp_path):
    folder = tmp_path / "out.orbax-checkpoint-tmp-suture-1"
    folder.mkdir()
    (folder / "_METADATA").write_text("{}")
    with pytest.raises(suture.UnfinishedCheckpointError, match="never completed|unfinished"):
        suture.open(folder)


def test_corrupt_checkpoint(tmp_path):
    save_file({"a": np.ones(2, np.float32)}, str(tmp_path / "one.safetensors"))
    save_file({"a": np.ones(2, np.float32)}, str(tmp_path / "two.safetensors"))
    with pytest.raises(suture.CorruptCheckpointError, match=r"Tensor 'a' appears in two shards"):
        suture.open(tmp_path)


def test_missing_leaf(ckpt):
    with pytest.raises(suture.MissingLeafError, match=r"has no leaf 'a/x'. Did you mean 'a/w'"):
        ckpt["a/x"]


def test_invalid_index(ckpt):
    with pytest.raises(suture.InvalidIndexError, match=r"Index 5 is out of bounds for axis 0"):
        ckpt["a/w"][5]


def test_shape_mismatch(ckpt):
    with pytest.raises(suture.ShapeMismatchError, match=r"which does not fit a/w"):
        suture.stack([ckpt["a/w"], ckpt["a/w"][:1]])


def test_pattern():
    with pytest.raises(suture.PatternError, match=r"'\[' is not a valid regular expression"):
        compile_pattern("[", "grep")


def test_rule(ckpt):
    with pytest.raises(suture.RuleError, match=r"rename\('nope', 'x'\) matches no path"):
        suture.rules.apply_rules([suture.rules.rename("nope", "x")], ckpt.tree)


def test_transform():
    with pytest.raises(suture.TransformError, match="needs at least one tree"):
        suture.intersect_trees()


def test_recipe(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("- drop: 5\n")
    with pytest.raises(suture.RecipeError, match=r"drop: field 'pattern' must be a string"):
        load_recipe(recipe)
    with pytest.raises(suture.RecipeError, match=r"does not exist"):
        load_recipe(tmp_path / "missing.yaml")


def test_merge(ckpt):
    with pytest.raises(suture.MergeError, match=r"Unknown merge method 'average'"):
        suture.merge([ckpt, ckpt], method="average")


def test_collective():
    class Client:  # another process reported a failure
        def key_value_dir_get(self, prefix):
            return [(f"{prefix}1", "process 1 failed: OSError: disk full")]

    group = Group(Client(), count=2, index=0, name="save")
    with pytest.raises(suture.CollectiveError, match=r"abandoned on every process because proc"):
        group.raise_if_failed()


def test_argument(tmp_path):
    with pytest.raises(suture.ArgumentError, match=r"Unknown format 'zip'"):
        suture.open(tmp_path, format="zip")
    tree = {"w": np.ones(2, np.float32)}
    with pytest.raises(suture.ArgumentError, match=r"Cannot read 'lots' as a size"):
        suture.save(tree, tmp_path / "out", max_memory="lots")


def test_unsupported(tmp_path):
    tree = {"w": np.ones(2, np.float32), "note": "text"}
    with pytest.raises(suture.UnsupportedError, match=r"safetensors holds only arrays"):
        suture.save(tree, tmp_path / "out.safetensors", format="safetensors")


def test_destination(tmp_path):
    tree = {"w": np.ones(2, np.float32)}
    with pytest.raises(suture.DestinationError, match=r"does not exist. Create it first") as error:
        suture.save(tree, tmp_path / "no" / "out")
    assert isinstance(error.value, OSError)


def test_destination_exists(tmp_path):
    tree = {"w": np.ones(2, np.float32)}
    suture.save(tree, tmp_path / "out")
    with pytest.raises(suture.DestinationExistsError, match=r"already exists. Pass overwrite"):
        suture.save(tree, tmp_path / "out")
    with pytest.raises(FileExistsError):
        suture.save(tree, tmp_path / "out")


def test_path_conflict():
    with pytest.raises(suture.PathConflictError, match=r"goes through 'a', which is also a leaf"):
        suture.unflatten({"a": 1, "a/b": 2})


def test_tree_mismatch():
    with pytest.raises(suture.TreeMismatchError, match=r"1 path\(s\) are not in the template"):
        suture.unflatten({"a": 1, "b": 2}, like={"a": 0})
