"""The report JSONs' schemas as JSON Schema (draft 2020-12), built from the results dataclasses, and checked
with ``jsonschema``: a failure is one ``ValueError`` naming the key at fault (``loaders[0].machine.cores is
missing``, ``loaders[1].epoch_seconds must be number|null``)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError, best_match

__all__ = ["DRAFT", "array", "check", "fields", "free_map", "kind", "obj", "or_null"]

DRAFT = "https://json-schema.org/draft/2020-12/schema"
_OF_TYPE = {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}
_SAID = {"array": "list", "object": "dict"}  # as a Python reader knows them


def kind(text: str) -> dict[str, Any]:
    """``"number|null"`` -> the schema of a number or null."""
    types = text.split("|")
    return {"type": types if len(types) > 1 else types[0]}


def obj(properties: dict[str, Any]) -> dict[str, Any]:
    """An object holding every one of ``properties`` (and any other key: readers ignore keys they do not
    know)."""
    return {"type": "object", "properties": properties, "required": list(properties)}


def array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def free_map(values: dict[str, Any]) -> dict[str, Any]:
    """An object whose keys are free (loader or stage names), each value of one schema."""
    return {"type": "object", "additionalProperties": values}


def or_null(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [{"type": "null"}, schema]}


def fields(cls: type, but: Sequence[str] = ()) -> dict[str, Any]:
    """A results dataclass of plain fields (all but ``but``) as an object: its JSON is ``asdict``. A float
    may be null: the report writes a value it could not measure (not finite) as null. A map (the
    transitions: kind -> [seconds, count]) is of free keys, each a list of numbers."""
    props = {}
    for f in dataclasses.fields(cls):
        if f.name in but:
            continue
        if str(f.type).startswith("dict[str, "):
            props[f.name] = free_map(array(kind("number|null")))
            continue
        base, _, optional = str(f.type).partition(" | ")
        text = _OF_TYPE[base] + ("|null" if optional == "None" or base == "float" else "")
        props[f.name] = kind(text)
    return obj(props)


def check(value: Any, schema: dict[str, Any]) -> None:
    """Raise ValueError naming the first key of ``value`` at fault against ``schema``."""
    error = best_match(jsonschema.Draft202012Validator(schema).iter_errors(value))
    if error is not None:
        raise ValueError(f"report JSON: {_said(error)}")


def _said(error: ValidationError) -> str:
    where = _path(error.absolute_path)
    if error.validator == "required":
        missing = re.match(r"'(.*)' is a required property", error.message)
        key = missing[1] if missing else error.message
        return f"{where}.{key} is missing" if where else f"{key} is missing"
    if error.validator == "type":
        types = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
        said = "|".join(_SAID.get(t, t) for t in types)
        return f"{where or 'the report'} must be {said}, got {error.instance!r:.40}"
    if error.validator == "const":
        return f"{where} must be {error.validator_value!r}, got {error.instance!r:.40}"
    return f"{where or 'the report'}: {error.message}"


def _path(parts: Sequence[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text
