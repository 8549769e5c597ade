"""Typed config models that refuse bad input in one line: the base every config section of the
project derives from (the trainer's config, the tokenize job's mixture files), its value types and
the translation of pydantic's errors into one line naming the dotted key, the value and the rule
(``optimizer.b1=2.0; must be in [0, 1)``) and, for a typo'd key, the nearest valid one.

Strict types: the only conversions are the ones YAML needs (an int where a float goes, YAML 1.1's
``3e-4`` string as a float, an integral float as an int, a list or one value as a tuple); a bool is
no number and a number no string. A family whose loader reads YAML 1.2 floats (``yaml12_floats``:
the mixture files) takes no string for a float at all (``Number``: a quoted "0.8" is refused).
Each family of models names its error class and prefix (``error_class``, ``error_prefix``: the
trainer's ``ConfigError`` "bad trainer config: ", pipelines.mixture's ``MixtureError``).
"""

from __future__ import annotations

import difflib
import math
import re
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any, ClassVar

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

from contract.errors import Refused

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
    error_class: ClassVar[type[Refused]] = Refused  # what a refused value raises (a family's own class)
    error_prefix: ClassVar[str] = ""  # its message's first words ("bad trainer config: ")

    @classmethod
    def before_build(cls, raw: dict[str, Any]) -> dict[str, Any]:
        """``raw`` as ``build`` validates it (the trainer's config moves renamed keys here)."""
        return raw

    @classmethod
    def refused(cls, text: str) -> Refused:
        """This family's error with its prefix."""
        return cls.error_class(cls.error_prefix + text)


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


def _number(v: Any) -> Any:
    if isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if isinstance(v, float) and not math.isfinite(v):
        raise _non_finite_error(v)
    return v  # a string is left to the strict float: refused ("is not a float")


Float = Annotated[float, BeforeValidator(_float)]
OptFloat = Annotated[float | None, BeforeValidator(_float)]
# A float of a file read with YAML 1.2 floats (`yaml12_floats`): an int is one, a string never is
# (a quoted "0.8" is a string, refused as `true` is)
Number = Annotated[float, BeforeValidator(_number)]
OptNumber = Annotated[float | None, BeforeValidator(_number)]
FloatOrStr = Annotated[float | str, BeforeValidator(_float_or_str)]
Int = Annotated[int, BeforeValidator(_int), AfterValidator(_int64)]
OptInt = Annotated[int | None, BeforeValidator(_int), AfterValidator(_int64)]
Strs = Annotated[tuple[str, ...], BeforeValidator(_tuple)]
OptStrs = Annotated[tuple[str, ...] | None, BeforeValidator(_tuple)]


def one_of(options: Sequence[Any]) -> AfterValidator:
    """A value from a set known only at run time (a registry's names; ``Literal`` wants them in
    the source); None passes (the field's default)."""

    def validate(v: Any) -> Any:
        if v is not None and v not in options:
            raise PydanticCustomError("one_of", "not one of its options", {"options": list(options)})
        return v

    return AfterValidator(validate)


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
        if isinstance(part, int):  # an item of a list of sections: the section's fields follow
            continue
        if model is None or part not in model.model_fields:
            break
        info = model.model_fields[part]
        model = _model_in(info.annotation)
    return info


def _dotted(cls: type[Model], loc: Sequence[Any]) -> str:
    """The key as a YAML file writes it; a dict-key marker is the field's own, a list index is
    written after its list when a section follows it (``sources[1].weight``: which source)."""
    out = cls.where
    for i, p in enumerate(loc):
        if isinstance(p, int) and i + 1 < len(loc) and isinstance(loc[i + 1], str) and loc[i + 1] != "[key]":
            out += f"[{p}]"
        elif isinstance(p, str) and p != "[key]":
            out += ("." if out and not out.endswith(".") else "") + p
    return out


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
    where = _dotted(cls, (*section, "_"))[:-1] if section else cls.where  # "sources[0]." (the "_" keeps an index)
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
    if kind == "one_of":
        return f"{key}={value!r}; expected one of {ctx['options']}"
    if kind == "missing":
        return f"{key} is missing (required)"
    if kind == "literal_error":
        options = typing.get_args(info.annotation) if info is not None else ctx.get("expected")
        return f"{key}={value!r}; expected one of {options}"
    if kind in _KINDS or kind == "not_a":
        return f"{key}={value!r} is not a {ctx.get('kind', _KINDS.get(kind))}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{key or 'config'} must be a mapping, got {value!r}"
    return f"{key}={value!r}: {e['msg']}"


def config_error(error: ValidationError, cls: type[Model]) -> Refused:
    """pydantic's errors as one line: unknown keys first (the outermost section's), then the
    first other error in field order."""
    errors = error.errors()
    return cls.refused(_unknown_keys(cls, errors) or _message(cls, errors[0]))


def build(cls: type[Model], raw: Any) -> Any:
    """``cls`` from a mapping (a YAML file's, with overrides; a recorded ``to_dict()``), or its
    family's error naming the key (after ``cls.before_build``)."""
    if not isinstance(raw, dict):
        raise cls.refused(f"config must be a mapping, got {raw!r}")
    raw = cls.before_build(raw)
    try:
        return cls.model_validate(raw)
    except ValidationError as e:
        raise config_error(e, cls) from None


# ----------------------------------------------------------------------------- YAML


# A YAML 1.2 float that YAML 1.1 (PyYAML) reads as a string: an exponent without a dot or its sign
# (`3e-4`, `1e5`, `1.0e5`); `yaml12_floats` makes a loader read these as floats
YAML12_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$")


def yaml12_floats(loader: type[yaml.SafeLoader]) -> type[yaml.SafeLoader]:
    """`loader` (a family's own subclass) reading `3e-4` as the float YAML 1.2 says it is, so that
    the family's float fields can be strict (`Number`: a string is refused, not converted)."""
    loader.add_implicit_resolver("tag:yaml.org,2002:float", YAML12_FLOAT, list("-+0123456789."))
    return loader


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key repeated in one mapping, naming the file, the line and the
    first occurrence (PyYAML keeps the last one silently and offers no option to refuse it, hence
    this small subclass). A family subclasses it with its own ``error_class``."""

    error_class: ClassVar[type[Exception]] = Refused

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *anchor` merges are resolved by flatten_mapping
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:  # unhashable key: SafeLoader's own error says so
                continue
            line = key_node.start_mark.line + 1
            if key in first:
                raise self.error_class(
                    f"{key_node.start_mark.name}:{line}: duplicate key {key!r} (first at line "
                    f"{first[key]}); a key may appear once per mapping (no silent last-wins)"
                )
            first[key] = line
        return super().construct_mapping(node, deep=deep)
