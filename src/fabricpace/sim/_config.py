"""Reading the YAML files users write (workloads, noise, scenarios) with one-line errors.

Every problem becomes a ``ConfigError`` whose first line names the file, the field and what to do,
so the CLI can print it and exit 2 without a traceback.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from fabricpace._errors import ConfigError
from fabricpace._yaml import read_yaml
from fabricpace._yaml import validate as _validate

M = TypeVar("M", bound=BaseModel)

__all__ = ["close_hint", "data_dir", "presets", "read_yaml", "resolve", "validate"]


def data_dir(kind: str) -> Path:
    """Folder of shipped files of one kind (workloads, noise, scenarios)."""
    return Path(str(resources.files("fabricpace") / "data" / kind))


def presets(kind: str) -> list[str]:
    folder = data_dir(kind)
    if not folder.is_dir():
        return []
    names = {p.stem for p in folder.glob("*.yaml")} | {p.name for p in folder.iterdir() if p.is_dir()}
    return sorted(n for n in names if not n.startswith(("_", ".")))


def validate(model: type[M], raw: dict[str, Any], *, source: str) -> M:
    """Validate a simulator file (workload, noise, scenario); errors point at docs/simulator.md."""
    return _validate(model, raw, source=source, docs="docs/simulator.md")


def resolve(name_or_path: str | Path, kind: str) -> tuple[Path, bool]:
    """A preset name or a file path -> (path, is_preset). Unknown names list the presets."""
    text = str(name_or_path)
    candidate = Path(text)
    if candidate.exists():
        return candidate, False
    shipped = data_dir(kind) / f"{text}.yaml"
    if "/" not in text and shipped.is_file():
        return shipped, True
    shipped_dir = data_dir(kind) / text
    if "/" not in text and shipped_dir.is_dir():
        return shipped_dir, True
    looks_like_file = text.endswith((".yaml", ".yml")) or "/" in text
    what = "file not found" if looks_like_file else f"unknown {kind.removesuffix('s')} preset"
    # a scenario is a folder (scenario.yaml and the files it names), not a YAML file
    use = "a scenario folder (one holding scenario.yaml)" if kind == "scenarios" else "a YAML file"
    raise ConfigError(
        f"{text}: {what}{close_hint(Path(text).name, presets(kind))}; use {use} or one of the presets: "
        f"{', '.join(presets(kind)) or '(none)'}"
    )


def close_hint(name: str, names: list[str]) -> str:
    """' (did you mean 'gpt-1.3b'?)' for a mistyped name among ``names``, or ''."""
    close = difflib.get_close_matches(name, names, n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
