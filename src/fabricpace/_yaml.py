"""Reading the YAML files users write, with one-line errors (shared by every config loader).

Every problem becomes a ``ConfigError`` whose first line names the file (and line or field) and what
to do, so the CLI can print it and exit 2 without a traceback. ``load_yaml_text`` is the one YAML loader
of user files (cluster, workload, noise, scenario and lab files): it refuses a key given twice in one
mapping, which ``yaml.safe_load`` would let the last one win silently (a second ``slow:`` block dropped
the first fault without a word).
"""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from fabricpace._errors import ConfigError

M = TypeVar("M", bound=BaseModel)

_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeyError(yaml.YAMLError):
    """A mapping of a user's YAML file gives one key twice (``line`` counts from 1)."""

    def __init__(self, key: Any, line: int, first_line: int) -> None:
        super().__init__(f"key {key!r} given twice (lines {first_line} and {line})")
        self.key = key
        self.line = line
        self.first_line = first_line


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key repeated in one mapping (``<<`` merges may still be
    overridden: that is what a merge is for)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=False)
                try:
                    hash(key)
                except TypeError:
                    continue  # SafeLoader refuses an unhashable key itself, with its own message
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise DuplicateKeyError(key, line, seen[key])
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml_text(text: str, *, source: str) -> Any:
    """Parse YAML text (any document) with the one loader of user files.

    A key given twice is a ConfigError naming ``source:line`` and the key; YAML syntax errors are left
    to the caller as ``yaml.YAMLError`` (each file type words those its own way)."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except DuplicateKeyError as exc:
        raise ConfigError(
            f"{source}:{exc.line}: key {exc.key!r} given twice (first on line {exc.first_line}); "
            "merge them into one (YAML keeps only the last)"
        ) from exc


def parse_yaml(text: str, *, source: str) -> dict[str, Any]:
    """Parse YAML text that must hold a mapping; ``source`` names it in errors."""
    try:
        raw = load_yaml_text(text, source=source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = str(getattr(exc, "problem", exc))
        # A free-text value with ": " in it (description: "slow: 1.4x") is the usual cause.
        hint = "; quote a value that contains ': '" if "mapping values are not allowed" in problem else ""
        raise ConfigError(f"{source}{where}: not valid YAML ({problem}){hint}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        kind = type(raw).__name__
        raise ConfigError(f"{source}: expected a mapping of fields at the top level, got {kind}")
    return raw


def read_text(path: Path, *, what: str = "YAML file") -> str:
    """A user's text file as UTF-8; unreadable or not UTF-8 (Latin-1, UTF-16, binary) is a ConfigError."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); save it as UTF-8, "
            f"or check that it is the {what} you meant"
        ) from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc}); check the path") from exc


def read_yaml(path: Path) -> dict[str, Any]:
    """Read and parse a YAML mapping; unreadable or non-mapping files are ConfigErrors naming the file."""
    return parse_yaml(read_text(path), source=str(path))


def _model_at(model: Any, loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that holds the field at ``loc`` (list indices and dict keys walked through)."""
    current: Any = model
    in_list = False  # the last field walked was a list of models: an int part names one of its entries
    for part in loc:
        if isinstance(part, int):
            # 'slow.0.factr': the index of a list entry (the suggestion used to stop at it)
            if not in_list:
                return None
            in_list = False
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        if part not in current.model_fields:
            return None
        annotation = current.model_fields[part].annotation
        in_list = _is_list(annotation)
        current = _unwrap(annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _is_list(tp: Any) -> bool:
    """``list[X]`` or ``list[X] | None`` (tuples too)."""
    if typing.get_origin(tp) in (list, tuple):
        return True
    return any(typing.get_origin(a) in (list, tuple) for a in typing.get_args(tp))


def _unwrap(tp: Any) -> Any:
    """``list[X]``, ``X | None``, ``dict[str, X]`` -> ``X`` (the first model among the arguments)."""
    for _ in range(4):
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            return tp
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if models:
            return models[0]
        if not args:
            return tp
        tp = args[-1]
    return tp


def unknown_key_hint(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """' (did you mean 'batch_per_gpu'?)' for a misspelt key at ``loc``, or ''."""
    holder = _model_at(model, loc[:-1])
    if holder is None or not loc:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(holder.model_fields), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def first_error(exc: ValidationError) -> dict[str, Any]:
    """The error to show: an unknown key first (a misspelt key also makes the real one "missing", and
    naming only the missing one hides the typo), else pydantic's first."""
    errors = exc.errors()
    extra = [e for e in errors if e["type"] == "extra_forbidden"]
    return dict(extra[0] if extra else errors[0])


def validate(model: type[M], raw: dict[str, Any], *, source: str, docs: str) -> M:
    """Validate ``raw`` against ``model``; the first error becomes a one-line ConfigError."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = first_error(exc)
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            raise ConfigError(
                f"{source}: unknown key {field!r}{unknown_key_hint(model, loc)}; fix the spelling or "
                f"remove it (see {docs})"
            ) from exc
        if err["type"] == "missing":
            raise ConfigError(
                f"{source}: field '{field}': required field is missing; add it (see {docs})"
            ) from exc
        if err["type"] == "value_error":
            msg = msg.removeprefix("Value error, ")  # pydantic's prefix on a rule of ours says nothing
        # the value got and the fix, as cluster files say it: "Input should be greater than 0" alone
        # left the user to find which of several entries held the 0
        raise ConfigError(f"{source}: field '{field}': {msg}{got_text(err)}; fix it (see {docs})") from exc


def got_text(err: dict[str, Any]) -> str:
    """' (got 0)' for the value a validation error refused; '' when that is a whole mapping (a rule
    across fields: the message names the fields) or absent."""
    got = err.get("input")
    if got is None or isinstance(got, dict | list):
        return ""
    return f" (got {got!r})"
