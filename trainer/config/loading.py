"""Loading machinery of the trainer config (``trainer.config.schema`` holds the models themselves).

A YAML file may name a ``base`` file (relative to itself) whose values it overrides; dotted
``key=value`` pairs override both, their values parsed as YAML scalars (``steps=20``,
``lr=1e-3``, ``data=[a.json,b.json]``). The merged mapping is validated by pydantic, strictly,
through ``contract.config_model`` (the project's config base: its types and its one-line errors,
``bad trainer config: optimizer.b1=2.0; must be in [0, 1)``, with the nearest valid key for a typo).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import yaml

from contract import config_model
from contract.config_model import build as build
from contract.errors import Refused, yaml_error_line

BAD = "bad trainer config: "
log = logging.getLogger(__name__)


class ConfigError(Refused, ValueError):
    """A config that cannot be right: one line naming the key (a ValueError: the CLI exits 2)."""


class Model(config_model.Model):
    """Base of every trainer config section (``contract.config_model.Model`` with the trainer's
    error and its renamed keys)."""

    error_class: ClassVar[type[Refused]] = ConfigError
    error_prefix: ClassVar[str] = BAD
    renamed: ClassVar[dict[str, str]] = {}  # {old dotted key: new dotted key}, read as aliases (``build``)

    @classmethod
    def before_build(cls, raw: dict[str, Any]) -> dict[str, Any]:
        return with_renamed_keys(raw, cls.renamed)


def get_dotted(raw: dict[str, Any], key: str) -> tuple[bool, Any]:
    """(present, value) of a dotted key in a nested mapping."""
    node: Any = raw
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def with_renamed_keys(raw: dict[str, Any], renamed: dict[str, str]) -> dict[str, Any]:
    """``raw`` (copied where it changes) with each old key of ``renamed`` moved to its new one; the
    old and the new key both set, to different values, is a ConfigError (which one is meant?)."""
    for old, new in renamed.items():
        present, value = get_dotted(raw, old)
        if not present:
            continue
        raw = copy.deepcopy(raw)
        parent, _, leaf = old.rpartition(".")
        del (get_dotted(raw, parent)[1] if parent else raw)[leaf]
        had, current = get_dotted(raw, new)
        if had and current != value:
            raise ConfigError(f"{BAD}{old}={value!r} and {new}={current!r}: {old} is the old name of {new}; give one")
        set_dotted(raw, new, value)
    return raw


def renamed_note(keys: Sequence[str], renamed: dict[str, str], where: str) -> None:
    """A warning for each old key a file or an override uses (it still works; the new name is the one to write)."""
    for key in keys:
        if key in renamed:
            log.warning("%s: config key %s is now %s (read as it; rename it)", where, key, renamed[key])


def dotted_keys(raw: Any, prefix: str = "") -> list[str]:
    """Every dotted key of a nested mapping (sections and leaves)."""
    if not isinstance(raw, dict):
        return []
    out = []
    for k, v in raw.items():
        out.append(f"{prefix}{k}")
        out += dotted_keys(v, f"{prefix}{k}.")
    return out


# ----------------------------------------------------------------------------- YAML and overrides


def load(cls: type[Model], path: str | Path | None, overrides: Sequence[str] = (), whole: Sequence[str] = ()) -> Any:
    """``cls`` from a YAML file (or the defaults when None) plus ``key=value`` overrides.
    ``whole``: top-level mappings a file replaces instead of merging into its base's."""
    raw = load_yaml(Path(path), whole, renamed=cls.renamed) if path is not None else {}
    for item in overrides:
        key, value = parse_override(item)
        renamed_note([key], cls.renamed, "override")
        set_dotted(raw, cls.renamed.get(key, key), value)  # an old key's override sets the new one
    return build(cls, raw)


class _UniqueKeyLoader(config_model.UniqueKeyLoader):
    error_class = ConfigError


def load_yaml(
    path: Path, whole: Sequence[str] = (), _seen: tuple[Path, ...] = (), renamed: dict[str, str] | None = None
) -> dict[str, Any]:
    """The mapping of a YAML config file, merged over its ``base`` file's (recursively); each file's
    old keys (``renamed``) moved to their new names first, with a note, so a file's key overrides
    its base's under either name."""
    path = path.resolve()
    if path in _seen:
        raise ConfigError(f"config base cycle: {' -> '.join(map(str, _seen + (path,)))}")
    data = path.read_bytes()
    try:  # decoded here first: the file object's own UnicodeDecodeError names no file, nor where
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte {data[e.start]:#04x}); a trainer config is a UTF-8 YAML file"
        ) from None
    with open(path, encoding="utf-8") as f:  # a file object: YAML's marks (duplicate keys) name the file
        try:
            raw = yaml.load(f, Loader=_UniqueKeyLoader) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {yaml_error_line(e)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a trainer config must be a YAML mapping")
    base = raw.pop("base", None)
    if renamed:
        renamed_note(dotted_keys(raw), renamed, str(path))
        raw = with_renamed_keys(raw, renamed)
    if base is None:
        return raw
    merged = load_yaml(path.parent / base, whole, _seen + (path,), renamed)
    deep_merge(merged, raw, whole)
    return merged


def deep_merge(into: dict[str, Any], other: dict[str, Any], whole: Sequence[str] = ()) -> None:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict) and key not in whole:
            deep_merge(into[key], value)
        else:
            into[key] = value


def parse_override(item: str) -> tuple[str, Any]:
    """``"optimizer.mu_dtype=bfloat16"`` → ``("optimizer.mu_dtype", "bfloat16")`` (YAML-parsed value)."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} is not of the form key=value")
    if not text.strip():
        return key.strip(), None
    try:  # the YAML files' loader: a key repeated in an inline mapping is refused, not last-wins
        return key.strip(), yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        raise ConfigError(f"override {item!r}: not valid YAML: {yaml_error_line(e)}") from None
    except ValueError as e:  # _UniqueKeyLoader's duplicate key, named by its place in the override
        raise ConfigError(f"override {item!r}: {str(e).removeprefix('<unicode string>:1: ')}") from None


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {key!r}: {part!r} is not a section")
    node[parts[-1]] = value
