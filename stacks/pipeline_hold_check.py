"""The self-mutation hold's comparison, run by the ``PipelineChange`` project with ``python3 -c``.

``python3 -c CHECK STACK ASSEMBLY DEPLOYED WHERE`` (Python's standard library only: nothing of
the commit runs) prints ``PIPELINE_CHANGE_APPROVAL=true|false`` and ``PIPELINE_CHANGE=<json
text>`` for the buildspec to source. ``STACK`` is the pipeline stack's hierarchical ID, the one
``SelfMutate`` passes to ``cdk deploy``; ``ASSEMBLY`` the cloud assembly ``SelfMutate`` deploys
from; ``DEPLOYED`` the deployed template (an empty or unreadable file: a person decides);
``WHERE`` a JSON object of where the deployed definition says the stack deploys: its
``stackName``, ``environment``, ``assumeRoleArn`` and ``cloudFormationExecutionRoleArn``.

What it checks, each a reason to ask a person when it fails:

1. **What SelfMutate deploys**, resolved as the CDK CLI resolves ``cdk -a ASSEMBLY deploy STACK``:
   every stack artifact of the assembly's ``manifest.json`` and of its nested assemblies whose
   hierarchical ID (``displayName``, else the artifact's ID) is ``STACK``. Exactly one may match;
   it must deploy ``WHERE``'s stack name (``stackName``, else the artifact's ID), in its account and
   region with ``WHERE``'s roles, with no ``parameters``,
   no other stack among its ``dependencies`` (the CLI deploys those too) and no manifest property
   the check does not know. Its template is ``templateFile``; where it has a
   ``stackTemplateAssetObjectUrl`` (the CLI then uploads the template through the stack's asset
   manifest and CloudFormation reads that object), the asset at that key must be that same file,
   its SHA-256 the key's. The assembly's root holds nothing but what a cloud assembly holds: a
   ``cdk.json``, ``.npmrc`` or ``package.json`` there would configure the CLI or npm that
   SelfMutate runs.
2. **The pipeline's own definition**: that template against the deployed one, every resource but
   the asset publishing, which changes with every model or code change.
3. **The asset publishing**, against the shape of the deployed pipeline's own asset projects, as
   CDK Pipelines generated them: each ``Assets`` action and project must equal a deployed one in
   every property (its role, environment, action role, inputs, buildspec) but its name, its
   project's description and its ``cdk-assets ... publish`` lines; those lines must have a deployed
   line's form, with a plain path to an asset manifest of the assembly and a plain asset selector.
   No asset of those manifests, nor of the pipeline stack's, may run a command (``executable``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from typing import Any

#: What a cloud assembly's root holds (``cdk synth``'s outputs); anything else is named.
ROOT_ENTRIES = re.compile(r"(manifest\.json|tree\.json|cdk\.out|validation-report\.json"
                          r"|[A-Za-z0-9._-]+\.(template|assets|metadata)\.json|[A-Za-z0-9]+\.dot"
                          r"|asset\.[0-9a-f]{64}(\.[A-Za-z0-9]+)?|assembly-[A-Za-z0-9._-]+)")
#: Stack-artifact properties the check reads, or that change nothing it compares.
KNOWN = {"templateFile", "stackTemplateAssetObjectUrl", "stackName", "parameters", "assumeRoleArn",
         "cloudFormationExecutionRoleArn", "lookupRole", "requiresBootstrapStackVersion",
         "bootstrapStackVersionSsmParameter", "terminationProtection", "validateOnSynth", "additionalDependencies",
         "tags"}
#: A quoted argument of a publishing line: a plain path or selector (no quote, ``$``, backquote).
PLAIN = re.compile(r'"([A-Za-z0-9._/:-]+)"')
ASSETS = "Assets"


def load(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def stacks(directory: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(directory, artifact ID, artifact) of every stack, nested assemblies too (the CLI's
    ``stacksRecursively``)."""
    manifest = load(os.path.join(directory, "manifest.json"))
    if not isinstance(manifest, dict):
        raise ValueError(os.path.join(directory, "manifest.json") + " cannot be read")
    found = []
    for key, artifact in (manifest.get("artifacts") or {}).items():
        kind = artifact.get("type")
        if kind == "aws:cloudformation:stack":
            found.append((directory, key, artifact))
        elif kind == "cdk:cloud-assembly":
            found += stacks(os.path.join(directory, str((artifact.get("properties") or {}).get("directoryName"))))
    return found


def resolve(stack: str, assembly: str, where: dict[str, Any], problems: list[str]) -> tuple[str, list[str]] | None:
    """The template ``cdk deploy stack`` deploys and the asset manifests it publishes, or None
    (with the problem named) when that is not the one pipeline stack."""
    strays = sorted(e for e in os.listdir(assembly) if not ROOT_ENTRIES.fullmatch(e))
    if strays:
        problems.append("the cloud assembly's root holds " + ", ".join(strays[:5]) + ", which no synth writes")
    try:
        everything = stacks(assembly)
    except ValueError as error:
        problems.append(str(error))
        return None
    selected = [s for s in everything if (s[2].get("displayName") or s[1]) == stack]
    if len(selected) != 1:
        problems.append(f"cdk deploy {stack} selects {len(selected)} stacks of manifest.json, not 1")
        return None
    directory, key, artifact = selected[0]
    properties = artifact.get("properties") or {}
    for name in sorted(set(properties) - KNOWN):
        problems.append(f"manifest.json sets {name} for {stack}, which the check does not know")
    if properties.get("stackName", key) != where.get("stackName", stack):
        problems.append("manifest.json deploys {} as stack {!r}".format(stack, properties.get("stackName", key)))
    for name, expected in sorted((k, v) for k, v in where.items() if k != "stackName"):
        given = artifact.get(name) if name == "environment" else properties.get(name)
        if given != expected:
            problems.append(f"manifest.json gives {stack} {name} {given!r}, not the pipeline's {expected!r}")
    if properties.get("parameters"):
        problems.append(f"manifest.json gives {stack} parameters")
    manifest = load(os.path.join(directory, "manifest.json")) or {}
    artifacts = manifest.get("artifacts") or {}
    asset_files = []
    for dependency in artifact.get("dependencies") or []:
        kind = (artifacts.get(dependency) or {}).get("type")
        if kind == "cdk:asset-manifest":
            asset_files.append(os.path.join(directory, str(artifacts[dependency]["properties"]["file"])))
        elif kind != "cdk:tree":
            problems.append(f"cdk deploy {stack} also deploys {dependency} ({kind})")
    template = os.path.join(directory, str(properties.get("templateFile")))
    url = properties.get("stackTemplateAssetObjectUrl")
    if url is not None:
        object_key = str(url).rsplit("/", 1)[-1]
        sources = [entry.get("source") for path in asset_files
                   for entry in ((load(path) or {}).get("files") or {}).values()
                   if any(d.get("objectKey") == object_key for d in (entry.get("destinations") or {}).values())]
        digest = None
        if os.path.isfile(template):
            with open(template, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        if sources != [{"path": properties.get("templateFile"), "packaging": "file"}]:
            problems.append("the template CloudFormation reads ({}) is not {}".format(object_key, properties.get("templateFile")))
        elif object_key.split(".")[0] != digest:
            problems.append("the template's SHA-256 is not its object's key " + object_key)
    return template, asset_files


def runs_commands(paths: list[str], problems: list[str]) -> None:
    for path in paths:
        manifest = load(path)
        if not isinstance(manifest, dict):
            problems.append("the asset manifest " + path + " cannot be read")
            continue
        for kind in ("files", "dockerImages"):
            for key, entry in (manifest.get(kind) or {}).items():
                if "executable" in (entry.get("source") or {}):
                    problems.append(f"asset {key[:12]} of {path} runs a command (executable)")


def frame(command: str) -> str:
    return PLAIN.sub('""', command)


def pipelines(template: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(k, r) for k, r in (template.get("Resources") or {}).items() if r.get("Type") == "AWS::CodePipeline::Pipeline"]


def asset_shapes(template: dict[str, Any]) -> tuple[list[Any], list[Any], set[str]]:
    """The deployed asset actions' and projects' shapes (their varying parts blanked) and the
    forms of their publishing lines."""
    actions: list[Any] = []
    projects: list[Any] = []
    frames: set[str] = set()
    resources = template.get("Resources") or {}
    for _, pipeline in pipelines(template):
        for stage in pipeline.get("Properties", {}).get("Stages", []):
            if stage.get("Name") != ASSETS:
                continue
            for action in stage.get("Actions", []):
                shape, ref = action_shape(action)
                actions.append(shape)
                project = resources.get(ref)
                if project is not None:
                    blank, lines = project_shape(project)
                    projects.append(blank)
                    frames.update(frame(line) for line in lines)
    return actions, projects, frames


def action_shape(action: dict[str, Any]) -> tuple[dict[str, Any], str]:
    shape = json.loads(json.dumps(action))
    shape.pop("Name", None)
    ref = (shape.get("Configuration") or {}).pop("ProjectName", None)
    return shape, ref["Ref"] if isinstance(ref, dict) and isinstance(ref.get("Ref"), str) else ""


def project_shape(project: dict[str, Any]) -> tuple[Any, list[str]]:
    shape = json.loads(json.dumps(project))
    properties = shape.get("Properties") or {}
    properties.pop("Description", None)
    source = properties.get("Source") or {}
    try:
        spec = json.loads(str(source.get("BuildSpec")))
        lines = spec["phases"]["build"]["commands"]
        spec["phases"]["build"]["commands"] = []
    except (TypeError, ValueError, KeyError):
        return shape, []
    source["BuildSpec"] = spec
    return shape, [str(line) for line in lines]


def check_assets(new: dict[str, Any], deployed: dict[str, Any], assembly: str, problems: list[str]) -> set[str]:
    """The new asset publishing against the deployed one's shape; returns the asset projects'
    logical IDs (left out of the comparison of the rest)."""
    actions, projects, frames = asset_shapes(deployed)
    resources = new.get("Resources") or {}
    seen, manifests = set(), []
    for _, pipeline in pipelines(new):
        for stage in pipeline.get("Properties", {}).get("Stages", []):
            if stage.get("Name") != ASSETS:
                continue
            for action in stage.get("Actions", []):
                name = str(action.get("Name"))
                shape, ref = action_shape(action)
                if shape not in actions:
                    problems.append("asset action " + name + " is not as CDK Pipelines made the deployed ones")
                project = resources.get(ref)
                if project is None:
                    problems.append(f"asset action {name} runs no project of the template")
                    continue
                seen.add(ref)
                blank, lines = project_shape(project)
                if blank not in projects:
                    problems.append(f"asset project {ref} (its role, environment or buildspec) is not as CDK Pipelines "
                                    "made the deployed ones")
                for line in lines:
                    paths = PLAIN.findall(line)
                    if frame(line) not in frames or '"' in PLAIN.sub("", line) or not paths:
                        problems.append(f"asset project {ref} runs {line[:120]!r}, not a publishing line")
                        continue
                    path = paths[0]
                    if ".." in path.split("/") or not path.endswith(".assets.json"):
                        problems.append(f"asset project {ref} publishes from {path!r}")
                    else:
                        manifests.append(os.path.join(assembly, path))
    runs_commands(sorted(set(manifests)), problems)
    return seen


def gates(template: dict[str, Any], assets: set[str]) -> dict[str, Any]:
    """The template without the asset projects, the Assets stage's actions blanked (its place kept)."""
    resources = dict(template.get("Resources") or {})
    for key, resource in pipelines(template):
        resource = json.loads(json.dumps(resource))
        for stage in resource.get("Properties", {}).get("Stages", []):
            if stage.get("Name") == ASSETS:
                stage["Actions"] = []
        resources[key] = resource
    return {k: v for k, v in resources.items() if k not in assets}


def main(argv: list[str]) -> int:
    stack, assembly, deployed_path = argv[1:4]
    where = json.loads(argv[4])
    problems: list[str] = []
    resolved = resolve(stack, assembly, where, problems)
    new = load(resolved[0]) if resolved else None
    old = load(deployed_path)
    old = old if isinstance(old, dict) and "Resources" in old else None
    if resolved and not (isinstance(new, dict) and "Resources" in new):
        problems.append(f"the template manifest.json names for {stack} ({resolved[0]}) cannot be read")
        new = None
    if resolved:
        runs_commands(resolved[1], problems)
    changed: list[str] = []
    if old is None:
        problems.append("the deployed pipeline's template could not be read")
    elif new is not None:
        assets_new = check_assets(new, old, assembly, problems)
        assets_old = {action_shape(a)[1] for _, p in pipelines(old) for s in p.get("Properties", {}).get("Stages", [])
                      if s.get("Name") == ASSETS for a in s.get("Actions", [])}
        a, b = gates(new, assets_new), gates(old, assets_old)
        changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    parts = []
    if problems:
        parts.append("; ".join(problems) + ": a person decides")
    if changed:
        shown = ", ".join(("added " if k not in b else "removed " if k not in a else "") + k for k in changed[:8])
        parts.append("the pipeline's own definition changes: " + shown
                     + (f" and {len(changed) - 8} more" if len(changed) > 8 else ""))
    text = "; ".join(parts) if parts else "no change of the pipeline's own definition"
    print("PIPELINE_CHANGE_APPROVAL=" + ("true" if parts else "false"))
    print("PIPELINE_CHANGE=" + json.dumps(text[:900]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
