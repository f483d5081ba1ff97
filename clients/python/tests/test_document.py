"""The client against the API document the live service serves.

Every operation of the document must be in the client's operation table,
and every request and answer body the document describes must match the
client's model: the same members, the same required ones, null where the
document allows it, nested models alike. Adding an operation or a member to
the document without doing so in the client fails here.
"""

import types
import typing

import pytest
from pydantic import BaseModel

from parlance_client import models as m
from parlance_client._operations import OPERATIONS, find

METHODS = ("get", "put", "post", "delete", "patch")


@pytest.fixture(scope="module")
def document(service):
    from parlance_client import Client

    with Client(service["url"], api_key=service["key"]) as c:
        return c.document()


def operations(doc):
    for path, item in doc["paths"].items():
        for method in METHODS:
            if method in item:
                yield method.upper(), path, item[method]


def resolve(doc, schema):
    while isinstance(schema, dict) and "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/"), ref
        node = doc
        for part in ref[2:].split("/"):
            node = node[part]
        schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def non_null(doc, schema):
    """The schema without its null alternative, and whether it allows null."""
    schema = resolve(doc, schema)
    for key in ("oneOf", "anyOf"):
        alts = schema.get(key)
        if alts:
            rest = [a for a in alts if resolve(doc, a).get("type") != "null"]
            if len(rest) < len(alts) and len(rest) == 1:
                return resolve(doc, rest[0]), True
    t = schema.get("type")
    if isinstance(t, list) and "null" in t:
        others = [x for x in t if x != "null"]
        return {**schema, "type": others[0] if len(others) == 1 else others}, True
    return schema, False


def object_members(doc, schema):
    """(properties, required) of an object schema, allOf merged; None when
    the schema is not an object with declared members."""
    schema = resolve(doc, schema)
    props, required, found = {}, set(), False
    for part in schema.get("allOf", []):
        sub = object_members(doc, part)
        if sub is not None:
            found = True
            props.update(sub[0])
            required |= sub[1]
    if "properties" in schema:
        found = True
        props.update(schema["properties"])
        required |= set(schema.get("required", []))
    return (props, required) if found else None


def is_free_object(doc, schema):
    schema = resolve(doc, schema)
    return schema.get("type") == "object" and object_members(doc, schema) is None and "oneOf" not in schema


def unwrap(annotation):
    """The annotation without Optional, and whether it allows None."""
    origin = typing.get_origin(annotation)
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is getattr(types, "UnionType")):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(annotation))
        return (args[0] if len(args) == 1 else typing.Union[tuple(args)]), nullable
    return annotation, annotation is typing.Any


def is_model(t):
    return isinstance(t, type) and issubclass(t, BaseModel)


def union_members(annotation):
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) is typing.Union:
        return list(typing.get_args(annotation))
    return [annotation]


def is_model_union(annotation):
    """A union of models (a tagged union may come wrapped in ``Annotated``)."""
    members = union_members(annotation)
    return len(members) > 1 and all(is_model(t) for t in members)


def compare(doc, schema, model, where, answer, errors):
    members = object_members(doc, schema)
    if members is None:
        errors.append(f"{where}: the document has no members for {model.__name__}: {resolve(doc, schema)}")
        return
    props, required = members
    fields = {(f.alias or name): f for name, f in model.model_fields.items()}
    missing = sorted(set(props) - set(fields))
    extra = sorted(set(fields) - set(props))
    if missing:
        errors.append(f"{where}: {model.__name__} lacks {missing}")
    if extra:
        errors.append(f"{where}: {model.__name__} has {extra}, which the document does not")
    for name in sorted(set(props) & set(fields)):
        field = fields[name]
        inner, nullable = unwrap(field.annotation)
        prop, doc_nullable = non_null(doc, props[name])
        here = f"{where}.{name}"
        if answer and name not in required and field.is_required():
            errors.append(f"{here}: optional in the document, required by {model.__name__}")
        if not answer and name in required and not field.is_required() and field.default is None:
            errors.append(f"{here}: required by the document, not sent by default by {model.__name__}")
        if answer and doc_nullable and not nullable:
            errors.append(f"{here}: may be null in the document, not in {model.__name__}")
        if typing.get_origin(inner) in (list, typing.List) and prop.get("type") == "array":
            (inner,) = typing.get_args(inner) or (typing.Any,)
            prop, _ = non_null(doc, prop.get("items", {}))
            here += "[]"
        elif typing.get_origin(inner) in (dict, typing.Dict) and isinstance(prop.get("additionalProperties"), dict):
            inner = (typing.get_args(inner) or (str, typing.Any))[1]
            prop, _ = non_null(doc, prop["additionalProperties"])
            here += "{}"
        if is_model(inner):
            compare(doc, prop, inner, here, answer, errors)
        elif is_model_union(inner):
            compare_union(doc, prop, inner, here, answer, errors)


def check_body(doc, schema, declared, where, answer, errors):
    if declared is None:
        errors.append(f"{where}: the document describes a body, the client declares none")
    elif typing.get_origin(declared) in (list, typing.List):
        array = resolve(doc, schema)
        (item,) = typing.get_args(declared)
        items = resolve(doc, array.get("items", {}))
        if array.get("type") != "array":
            errors.append(f"{where}: the client declares a list, the document {array}")
        elif is_model(item):
            compare(doc, items, item, f"{where}[]", answer, errors)
        elif item is str and items.get("type") != "string":
            errors.append(f"{where}[]: the client declares text, the document {items}")
    elif declared is m.JsonObject:
        if not is_free_object(doc, schema):
            errors.append(f"{where}: the document describes {resolve(doc, schema)}, the client a free-form object")
    elif is_model_union(declared):
        compare_union(doc, schema, declared, where, answer, errors)
    else:
        compare(doc, schema, declared, where, answer, errors)


def compare_union(doc, schema, declared, where, answer, errors):
    variants = resolve(doc, schema).get("oneOf") or resolve(doc, schema).get("anyOf")
    if not variants:
        errors.append(f"{where}: the client declares a union, the document {resolve(doc, schema)}")
        return
    models = union_members(declared)
    if len(models) != len(variants):
        errors.append(f"{where}: {len(variants)} variants in the document, {len(models)} in the client")
    for i, variant in enumerate(variants):
        names = set((object_members(doc, variant) or ({}, set()))[0])
        match = [mo for mo in models if {(f.alias or n) for n, f in mo.model_fields.items()} == names and _same_tag(doc, variant, mo)]
        if not match:
            errors.append(f"{where}[{i}]: no client model has the members {sorted(names)}")
        else:
            compare(doc, variant, match[0], f"{where}[{i}]", answer, errors)


TAGS = ("type", "kind")
"""The members a tagged union of the document is told apart by."""


def _same_tag(doc, variant, model):
    props = (object_members(doc, variant) or ({}, set()))[0]
    for name in TAGS:
        tag = resolve(doc, props.get(name, {})).get("enum")
        if tag and name in model.model_fields:
            return model.model_fields[name].default in tag
    return True


def json_schema(content):
    for media, body in (content or {}).items():
        if media.startswith("application/json"):
            return body.get("schema", {})
    return None


def test_the_document_is_valid_openapi_3_1(document):
    from openapi_spec_validator import OpenAPIV31SpecValidator

    assert document["openapi"] == "3.1.0"
    errors = [str(e) for e in OpenAPIV31SpecValidator(document).iter_errors()]
    assert not errors, "the document is not valid OpenAPI 3.1:\n" + "\n".join(errors[:20])


def test_every_documented_operation_is_in_the_client(document):
    missing = [f"{method} {path}" for method, path, _ in operations(document) if find(method, path) is None]
    assert not missing, f"operations the client lacks: {missing}"


def test_bodies_match_the_document(document):
    errors = []
    checked = 0
    for method, path, op in operations(document):
        name = find(method, path)
        if name is None:
            continue
        ours = OPERATIONS[name]
        where = f"{method} {path}"
        request = json_schema(op.get("requestBody", {}).get("content"))
        if request is not None:
            check_body(document, request, ours.request, f"{where} request", False, errors)
            checked += 1
        elif ours.request is not None:
            errors.append(f"{where}: the client sends a body the document does not take")
        for status, answer in op.get("responses", {}).items():
            if not status.startswith("2"):
                continue
            schema = json_schema(answer.get("content"))
            if schema is None:
                if ours.answer is not None and not answer.get("content"):
                    errors.append(f"{where} {status}: no body in the document, the client decodes one")
                continue
            if name == "document":
                continue  # the document itself: any JSON object
            check_body(document, schema, ours.answer, f"{where} {status}", True, errors)
            checked += 1
    assert checked > 0
    assert not errors, "the client differs from the document:\n" + "\n".join(errors)
