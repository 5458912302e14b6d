"""The deployed record: the part of the stack's template that ``plan`` judges, as it was deployed.

Why it exists: ``python -m model_build plan`` must say whether a change replaces the GPU fleet or
puts data at risk, from what CloudFormation will see (the template), not from a list of settings:
a new default container variable, a new EndpointConfig property or a newer image table replaces
the fleet as surely as a changed instance type. The deploy writes this record into the routes
document (the custom resource carries it as a property, computed from the synthesized resources),
so that ``plan`` compares template with template even offline, from a routes file alone.

The record holds, as the template renders them:

- the resources of :data:`RECORD_TYPES`: the fleet (SageMaker Model, EndpointConfig, Endpoint, the
  autoscaling target and policies) and the data (buckets, KMS keys, log groups);
- every resource those reference (``Ref`` / ``Fn::GetAtt``), transitively: a replaced security
  group or execution role replaces the Model that names it, so the record must show it;
- the mappings they read with ``Fn::FindInMap`` (the Triton image per region).

:func:`normalized` makes two templates comparable: a ``Fn::FindInMap`` is replaced by the values it
can take (so a newer image table is a change of the Model's ``Image``, and a renamed mapping with
the same values is not). References keep their form (``Ref`` / ``Fn::GetAtt`` to a logical id),
so the CDK's diff engine propagates a replacement through them.

This module is pure (no CDK, no AWS): the format, its checks, and the normalization.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from triton_mme_cdk.model_build.errors import ModelBuildError
from triton_mme_cdk.model_build.release.documents import schema_document

#: The record's format; a reader refuses another.
DEPLOYED_SCHEMA = "triton-mme/deployed/1"

#: Resources whose replacement replaces the GPU fleet (a blue/green rollout of every instance).
FLEET_REPLACED_TYPES: tuple[str, ...] = ("AWS::SageMaker::Model", "AWS::SageMaker::EndpointConfig")
#: The rest of the fleet: updated in place (the Endpoint moves to a new config; scaling bounds).
FLEET_IN_PLACE_TYPES: tuple[str, ...] = (
    "AWS::SageMaker::Endpoint", "AWS::ApplicationAutoScaling::ScalableTarget",
    "AWS::ApplicationAutoScaling::ScalingPolicy",
)
FLEET_TYPES: tuple[str, ...] = FLEET_REPLACED_TYPES + FLEET_IN_PLACE_TYPES
#: Resources that hold data (or, for the endpoint, its name and traffic): replacing or deleting one
#: loses what it holds. The endpoint is here too: its replacement is downtime under a fixed name.
DATA_TYPES: tuple[str, ...] = (
    "AWS::S3::Bucket", "AWS::KMS::Key", "AWS::Logs::LogGroup", "AWS::SageMaker::Endpoint",
)
RECORD_TYPES: tuple[str, ...] = tuple(dict.fromkeys(FLEET_TYPES + DATA_TYPES))
#: Resource attributes kept beside ``Properties`` (the diff engine reads the deletion policy of a
#: removed resource: deleted or orphaned).
RESOURCE_ATTRIBUTES: tuple[str, ...] = ("DeletionPolicy", "UpdateReplacePolicy")
#: Largest record read (the default stack's is about 20 KB).
MAX_RECORD_BYTES = 1024 * 1024


class DeployedRecordError(ModelBuildError):
    """A deployed record or template that does not parse or has another format."""


def _objects(value: Any) -> Iterator[dict[str, Any]]:
    """Every JSON object inside ``value`` (itself included), depth first."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            yield item
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)


def references(value: Any) -> set[str]:
    """Logical ids that ``value`` names with ``Ref`` or ``Fn::GetAtt`` (pseudo parameters excluded)."""
    found: set[str] = set()
    for item in _objects(value):
        if len(item) != 1:
            continue
        if isinstance(item.get("Ref"), str) and not item["Ref"].startswith("AWS::"):
            found.add(item["Ref"])
        elif "Fn::GetAtt" in item:
            target = item["Fn::GetAtt"]
            name = target[0] if isinstance(target, list) and target else str(target).split(".")[0]
            if isinstance(name, str):
                found.add(name)
        elif "Fn::Sub" in item:
            found.update(_sub_references(item["Fn::Sub"]))
    return found


def _sub_references(args: Any) -> set[str]:
    text = args[0] if isinstance(args, list) and args else args
    bound = set(args[1]) if isinstance(args, list) and len(args) > 1 and isinstance(args[1], dict) else set()
    names: set[str] = set()
    if isinstance(text, str):
        for part in text.split("${")[1:]:
            name = part.split("}")[0].split(".")[0]
            if name and not name.startswith(("AWS::", "!")) and name not in bound:
                names.add(name)
    return names


def mappings_read(value: Any) -> set[str]:
    """The mappings ``value`` reads with ``Fn::FindInMap``."""
    found: set[str] = set()
    for item in _objects(value):
        args = item.get("Fn::FindInMap") if len(item) == 1 else None
        if isinstance(args, list) and args and isinstance(args[0], str):
            found.add(args[0])
    return found


def record_ids(resources: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The logical ids the record holds: the resources of :data:`RECORD_TYPES` and, transitively,
    every resource they reference (sorted)."""
    todo = [lid for lid, resource in resources.items() if resource.get("Type") in RECORD_TYPES]
    seen: set[str] = set()
    while todo:
        lid = todo.pop()
        if lid in seen or lid not in resources:
            continue
        seen.add(lid)
        todo.extend(references(resources[lid].get("Properties") or {}))
    return sorted(seen)


def record_from_template(template: Mapping[str, Any]) -> dict[str, Any]:
    """The record of a synthesized or deployed template (what the deploy writes for this template)."""
    resources = template.get("Resources") or {}
    if not isinstance(resources, dict):
        raise DeployedRecordError("template: 'Resources' is not an object")
    held = {lid: _kept(resources[lid]) for lid in record_ids(resources)}
    return make_record(held, template.get("Mappings") or {})


def make_record(resources: Mapping[str, Mapping[str, Any]], mappings: Mapping[str, Any]) -> dict[str, Any]:
    """A record of ``resources`` (each as the template renders it) with the ``mappings`` they read."""
    read = set().union(*(mappings_read(resource.get("Properties") or {}) for resource in resources.values()))
    missing = sorted(read - set(mappings))
    if missing:
        raise DeployedRecordError(f"deployed record: the resources read mapping(s) {', '.join(missing)}, "
                                  "whose content was not given")
    return {
        "schema": DEPLOYED_SCHEMA,
        "resources": {lid: _kept(resources[lid]) for lid in sorted(resources)},
        "mappings": {name: mappings[name] for name in sorted(read)},
    }


def _kept(resource: Mapping[str, Any]) -> dict[str, Any]:
    kept: dict[str, Any] = {"Type": resource.get("Type")}
    if resource.get("Properties"):
        kept["Properties"] = resource["Properties"]
    for attribute in RESOURCE_ATTRIBUTES:
        if attribute in resource:
            kept[attribute] = resource[attribute]
    return kept


def record_json(record: Mapping[str, Any]) -> str:
    """The record as the custom resource carries it: compact JSON with sorted keys (a string, so
    CloudFormation resolves nothing in it)."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def parse_record(value: Any, *, where: str) -> dict[str, Any]:
    """A record given as JSON text or as a parsed object; raises :class:`DeployedRecordError`."""
    if isinstance(value, str | bytes) and len(value) > MAX_RECORD_BYTES:
        raise DeployedRecordError(f"deployed record {where}: {len(value)} bytes; at most {MAX_RECORD_BYTES} are read")
    value = schema_document(value, schema=DEPLOYED_SCHEMA, where=f"deployed record {where}", error=DeployedRecordError)
    resources, mappings = value.get("resources"), value.get("mappings")
    if not isinstance(resources, dict) or not isinstance(mappings, dict) or not all(
            isinstance(item, dict) and isinstance(item.get("Type"), str) for item in resources.values()):
        raise DeployedRecordError(f"deployed record {where}: malformed (expected 'resources', each with a 'Type', "
                                  "and 'mappings')")
    return value


def endpoint_record(template: Mapping[str, Any], prefix: str | None,
                    resource_type: str = "Custom::TritonModelRelease", prop: str = "Deployed") -> dict[str, Any] | None:
    """The record the template carries for the endpoint that publishes under ``prefix``, where the
    template holds several endpoints (each build resource carries its own endpoint's record); None
    with one endpoint (its record is the template's own) or none matching."""
    carriers = [resource.get("Properties") or {} for resource in (template.get("Resources") or {}).values()
                if isinstance(resource, dict) and resource.get("Type") == resource_type]
    if len(carriers) < 2:
        return None
    for properties in carriers:
        if properties.get("ModelPrefix") == prefix and properties.get(prop):
            return parse_record(properties[prop], where=f"{resource_type} of prefix {prefix}")
    return None


def as_template(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record as a (partial) template: what the diff engine compares."""
    return {"Resources": dict(record["resources"]), "Mappings": dict(record["mappings"])}


# ---------------------------------------------------------------------------------------------
# Normalization: tokens compare by what they refer to
# ---------------------------------------------------------------------------------------------


def normalized(template: Mapping[str, Any], ids: Iterable[str] | None = None) -> dict[str, Any]:
    """``template`` (its resources, or those of ``ids``) with every ``Fn::FindInMap`` replaced by
    the values it can take: a lookup with literal keys by its value; one keyed by a pseudo
    parameter (the region) by ``{"Fn::FindInMap": {"Values": {<key>: <value>...}}}``. Nothing
    else changes: references stay references, for the diff engine to propagate."""
    mappings = template.get("Mappings") or {}
    resources = template.get("Resources") or {}
    chosen = resources if ids is None else {lid: resources[lid] for lid in ids if lid in resources}
    return {"Resources": {lid: _inline(_compared(resource), mappings) for lid, resource in chosen.items()}}


def _compared(resource: Mapping[str, Any]) -> dict[str, Any]:
    """What of a resource is compared: all but ``DependsOn`` and ``Metadata``, which order the
    deploy or annotate the template and change no physical resource."""
    return {key: value for key, value in resource.items() if key not in ("DependsOn", "Metadata")}


def _inline(value: Any, mappings: Mapping[str, Any]) -> Any:
    if isinstance(value, list):
        return [_inline(item, mappings) for item in value]
    if not isinstance(value, dict):
        return value
    args = value.get("Fn::FindInMap") if len(value) == 1 else None
    if isinstance(args, list) and len(args) >= 3 and isinstance(args[0], str) and args[0] in mappings:
        table = mappings[args[0]] or {}
        first, second = _inline(args[1], mappings), _inline(args[2], mappings)
        if isinstance(first, str) and isinstance(second, str):
            row = table.get(first)
            if isinstance(row, dict) and second in row:
                return row[second]
        elif isinstance(second, str):
            return {"Fn::FindInMap": {"Key": first, "Values": {
                name: row.get(second) for name, row in sorted(table.items()) if isinstance(row, dict)}}}
    return {key: _inline(item, mappings) for key, item in value.items()}


def check_embedded(template: Mapping[str, Any], resource_type: str = "Custom::TritonModelRelease",
                   prop: str = "Deployed") -> None:
    """The records a synthesized template carries (property ``prop`` of each ``resource_type``: one
    per endpoint built from a manifest) must be the template's own: each recorded resource as the
    template holds it, and, when every endpoint of the template carries one, each recorded resource
    of the template in one of them. Raises :class:`DeployedRecordError` naming the first resource
    that differs. A raw property override (``add_property_override``) on a recorded resource is the
    known way to break this: the record renders the properties the constructs set."""
    resources = template.get("Resources") or {}
    expected = record_from_template(template)
    covered: set[str] = set()
    carriers = 0
    for lid, resource in resources.items():
        if resource.get("Type") != resource_type or not (resource.get("Properties") or {}).get(prop):
            continue
        carriers += 1
        carried = parse_record(resource["Properties"][prop], where=f"{lid}.{prop}")
        for name in sorted(carried["resources"]):
            if carried["resources"][name] != expected["resources"].get(name):
                raise DeployedRecordError(
                    f"deployed record {lid}.{prop}: resource {name} differs from the template (a raw property "
                    "override on it? give the value through its construct instead)")
        covered.update(carried["resources"])
        if any(expected["mappings"].get(name) != content for name, content in carried["mappings"].items()):
            raise DeployedRecordError(f"deployed record {lid}.{prop}: its mappings differ from the template's")
    endpoints = sum(1 for resource in resources.values() if resource.get("Type") == "AWS::SageMaker::Endpoint")
    if carriers and carriers >= endpoints:
        for name in sorted(set(expected["resources"]) - covered):
            raise DeployedRecordError(f"deployed record: resource {name} of the template is in no endpoint's record")
