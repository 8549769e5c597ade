"""Loading machinery of the trainer config (``trainer.config.schema`` holds the models themselves).

A YAML file may name a ``base`` file (relative to itself) whose values it overrides; dotted
``key=value`` pairs override both, their values parsed as YAML scalars (``steps=20``,
``lr=1e-3``, ``data=[a.json,b.json]``). The merged mapping is validated by pydantic, strictly:
the only conversions are the ones YAML needs (an int where a float goes, YAML 1.1's ``3e-4``
string as a float, an integral float as an int, a list or one value as a tuple); a bool is no
number and a number no string. pydantic's errors are translated into one line that names the
dotted key, the value and the rule (``bad trainer config: optimizer.b1=2.0; must be in [0, 1)``)
and, for a typo'd key, the nearest valid one.
"""

from __future__ import annotations

import copy
import difflib
import logging
import math
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from contract.errors import Refused, yaml_error_line

BAD = "bad trainer config: "
log = logging.getLogger(__name__)


class ConfigError(Refused, ValueError):
    """A config that cannot be right: one line naming the key (a ValueError: the CLI exits 2)."""


# ----------------------------------------------------------------------------- models and types

if typing.TYPE_CHECKING:  # pydantic's metaclass, named for the type checker only (its module is private)
    from pydantic._internal._model_construction import ModelMetaclass as _ModelMeta
else:
    _ModelMeta = type(BaseModel)


class _OneLineErrors(_ModelMeta):
    """``Section(key=value)`` refuses a value in one line too. Not an ``__init__`` override:
    pydantic would then call it for every nested section, nesting the messages."""

    def __call__(cls, *args: Any, **values: Any) -> Any:
        try:
            return super().__call__(*args, **values)
        except ValidationError as e:
            raise config_error(e, typing.cast("type[Model]", cls)) from None


class Model(BaseModel, metaclass=_OneLineErrors):
    """Base of every config section: unknown keys refused, frozen, strict types.

    ``where``: the dotted prefix of this section's keys ("optimizer."), so that a section built
    on its own (``CheckpointConfig(keep=0)``) names its keys as a YAML file writes them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, protected_namespaces=())
    where: ClassVar[str] = ""
    renamed: ClassVar[dict[str, str]] = {}  # {old dotted key: new dotted key}, read as aliases (``build``)


def refuse(message: str) -> PydanticCustomError:
    """An error whose message is complete (cross-field rules name their own keys)."""
    return PydanticCustomError("refused", "{message}", {"message": message})


def _non_finite_error(value: float, suffix: str = "") -> PydanticCustomError:
    return PydanticCustomError("non_finite", "not a finite number", {"value": value, "suffix": suffix})


def _float(v: Any) -> Any:
    if isinstance(v, str):  # YAML 1.1 reads "3e-4" (no dot) as a string
        try:
            v = float(v)
        except ValueError:
            return v
    elif isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if isinstance(v, float) and not math.isfinite(v):  # before any bound: inf passes ">= 0"
        raise _non_finite_error(v)
    return v


INT_END = 2**63  # every int field fits an int64 (numpy and JAX hold them so; a bigger one overflows there)


def _int(v: Any) -> Any:
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _int64(v: Any) -> Any:
    if v is not None and not -INT_END <= v < INT_END:
        raise PydanticCustomError("too_large", "too large", {"value": v, "limit": "2**63", "why": "an int64"})
    return v


def below(end: int, limit: str, why: str) -> AfterValidator:
    """An upper bound of its own, so that the field's ``description`` keeps saying its lower one."""

    def validate(v: Any) -> Any:
        if v is not None and v >= end:
            raise PydanticCustomError("too_large", "too large", {"value": v, "limit": limit, "why": why})
        return v

    return AfterValidator(validate)


def _tuple(v: Any) -> Any:
    return v if v is None else tuple(v) if isinstance(v, (list, tuple)) else (v,)


def _float_or_str(v: Any) -> Any:
    v = _float(v)
    if not isinstance(v, (float, str)):
        raise PydanticCustomError("not_a", "not a {kind}", {"kind": "float or str"})
    return v


Float = Annotated[float, BeforeValidator(_float)]
OptFloat = Annotated[float | None, BeforeValidator(_float)]
FloatOrStr = Annotated[float | str, BeforeValidator(_float_or_str)]
Int = Annotated[int, BeforeValidator(_int), AfterValidator(_int64)]
OptInt = Annotated[int | None, BeforeValidator(_int), AfterValidator(_int64)]
Strs = Annotated[tuple[str, ...], BeforeValidator(_tuple)]
OptStrs = Annotated[tuple[str, ...] | None, BeforeValidator(_tuple)]


def check(ok: Callable[[Any], bool]) -> AfterValidator:
    """A rule no bound (Field(gt=...)) says; the field's ``description`` says it in the error."""

    def validate(v: Any) -> Any:
        if v is not None and not ok(v):
            raise PydanticCustomError("rule", "breaks its rule", {"value": v})
        return v

    return AfterValidator(validate)


def non_finite(value: Any, key: str) -> tuple[str, float] | None:
    """(dotted key, value) of the first non-finite float in ``value`` (nested dicts/lists too)."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (key, value)
    if isinstance(value, dict):
        items = [(f"{key}.{k}", v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(f"{key}[{i}]", v) for i, v in enumerate(value)]
    else:
        return None
    return next((bad for bad in (non_finite(v, k) for k, v in items) if bad is not None), None)


def _all_finite(v: Any) -> Any:
    bad = non_finite(v, "")
    if bad is not None:
        raise _non_finite_error(bad[1], bad[0])
    return v


Finite = AfterValidator(_all_finite)  # free-form values (model_overrides): no float in them is inf/nan


# ----------------------------------------------------------------------------- errors

_KINDS = {
    "int_type": "int",
    "int_from_float": "int",
    "int_parsing": "int",
    "float_type": "float",
    "string_type": "str",
    "bool_type": "bool",
}
_BOUNDS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "rule"}


def _model_in(tp: Any) -> type[BaseModel] | None:
    """The config model inside a field's type (``WandbConfig | None`` → WandbConfig)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    return next((m for m in map(_model_in, typing.get_args(tp)) if m is not None), None)


def _field(cls: type[Model], loc: Sequence[Any]) -> Any:
    """The pydantic FieldInfo that ``loc`` (an error's location) is in, or None."""
    info: Any = None
    model: type[BaseModel] | None = cls
    for part in loc:
        if model is None or part not in model.model_fields:
            break
        info = model.model_fields[part]
        model = _model_in(info.annotation)
    return info


def _dotted(cls: type[Model], loc: Sequence[Any]) -> str:
    """The key as a YAML file writes it; a list index or dict-key marker is the field's own."""
    return cls.where + ".".join(str(p) for p in loc if isinstance(p, str) and p != "[key]")


def nearest(key: str, valid: Sequence[str]) -> str | None:
    """The valid key a typo most likely meant (None when nothing is close)."""
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    return close[0] if close else None


def _unknown_keys(cls: type[Model], errors: Sequence[ErrorDetails]) -> str | None:
    extra = [e["loc"] for e in errors if e["type"] == "extra_forbidden"]
    if not extra:
        return None
    section = min((loc[:-1] for loc in extra), key=len)  # the outermost section first, as it is read
    names = sorted(str(loc[-1]) for loc in extra if loc[:-1] == section)
    where = _dotted(cls, section) + "." if section else cls.where
    model = _model_in(_field(cls, section).annotation) if section else cls
    fields = sorted(model.model_fields) if model is not None else []
    meant = [f"{where}{m!s}" for m in (nearest(n, fields) for n in names) if m is not None]
    hint = f" (did you mean {', '.join(map(repr, meant))}?)" if meant else ""
    return f"unknown key(s) {[where + n for n in names]}{hint}; valid keys of {where or 'the top level'}: {fields}"


def _message(cls: type[Model], e: ErrorDetails) -> str:
    key, kind, ctx, value = _dotted(cls, e["loc"]), e["type"], e.get("ctx") or {}, e["input"]
    info = _field(cls, e["loc"])
    if kind == "refused":
        return ctx["message"]
    if kind == "too_large":
        return f"{key}={ctx['value']!r} is too large; must be < {ctx['limit']} ({ctx['why']})"
    if kind == "non_finite":
        return f"{key}{ctx['suffix']}={ctx['value']!r} is not a finite number"
    if kind in _BOUNDS:
        must = info.description if info is not None and info.description else e["msg"].lower()
        return f"{key}={ctx.get('value', value)!r}; must be {must}"
    if kind == "literal_error":
        options = typing.get_args(info.annotation) if info is not None else ctx.get("expected")
        return f"{key}={value!r}; expected one of {options}"
    if kind in _KINDS or kind == "not_a":
        return f"{key}={value!r} is not a {ctx.get('kind', _KINDS.get(kind))}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{key or 'config'} must be a mapping, got {value!r}"
    return f"{key}={value!r}: {e['msg']}"


def config_error(error: ValidationError, cls: type[Model]) -> ConfigError:
    """pydantic's errors as one line: unknown keys first (the outermost section's), then the
    first other error in field order."""
    errors = error.errors()
    text = _unknown_keys(cls, errors) or _message(cls, errors[0])
    return ConfigError(BAD + text)


def build(cls: type[Model], raw: Any) -> Any:
    """``cls`` from a mapping (a YAML file's, with overrides; a recorded ``to_dict()``), or
    ConfigError naming the key. A key ``cls.renamed`` lists is read under its new name."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{BAD}config must be a mapping, got {raw!r}")
    raw = with_renamed_keys(raw, cls.renamed)
    try:
        return cls.model_validate(raw)
    except ValidationError as e:
        raise config_error(e, cls) from None


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


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key repeated in one mapping (PyYAML keeps the last one
    silently and offers no option to refuse it, hence this small subclass)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:  # unhashable key: SafeLoader's own error says so
                continue
            line = key_node.start_mark.line + 1
            if key in first:
                raise ConfigError(
                    f"{key_node.start_mark.name}:{line}: duplicate key {key!r} (first at line "
                    f"{first[key]}); a key may appear once per mapping (no silent last-wins)"
                )
            first[key] = line
        return super().construct_mapping(node, deep=deep)


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
