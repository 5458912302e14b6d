"""The synthesized template's deploy-time resources, created in moto as CloudFormation would.

What ``cdk deploy`` creates before the endpoint exists (the model bucket, the CDK asset bucket
with the manifest asset in it, the build's roles, functions and two state machines) is taken
from the synthesized template, its tokens resolved as CloudFormation resolves them
(``Ref``, ``Fn::GetAtt``, ``Fn::Join``, ``Fn::Sub``, pseudo parameters), and created through
the AWS APIs of moto. The functions are registered with :mod:`local_lambda`, which runs them
when moto's Lambda Invoke API is called. Nothing here knows the state machines' contents: they
are the template's ``DefinitionString``s, resolved.

An intrinsic or resource type this module does not know fails with an error naming it, so a
construct that starts to use one cannot slip through unresolved.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from local_lambda import Function, LocalLambda

ACCOUNT = "123456789012"
REGION = "us-east-1"
PARTITION = "aws"
STACK_NAME = "TritonMme"
STACK_ID = f"arn:{PARTITION}:cloudformation:{REGION}:{ACCOUNT}:stack/{STACK_NAME}/4e1f0c3a-0000-4000-8000-000000000001"
PSEUDO = {
    "AWS::AccountId": ACCOUNT,
    "AWS::Region": REGION,
    "AWS::Partition": PARTITION,
    "AWS::URLSuffix": "amazonaws.com",
    "AWS::StackName": STACK_NAME,
    "AWS::StackId": STACK_ID,
}
_SUB = re.compile(r"\$\{([^}!][^}]*)\}")


class UnresolvedToken(ValueError):
    """A template value this resolver does not know how to resolve (names it)."""


@dataclass
class Template:
    """A synthesized template and its cloud assembly folder (for the assets)."""

    data: dict[str, Any]
    outdir: Path

    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        return dict(self.data["Resources"])

    def of_type(self, type_: str) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.resources.items() if v["Type"] == type_}

    def one(self, type_: str, prefix: str) -> str:
        """The logical id of the one resource of ``type_`` whose id starts with ``prefix``."""
        found = [k for k in self.of_type(type_) if k.startswith(prefix)]
        if len(found) != 1:
            raise LookupError(f"expected one {type_} named {prefix}*, found {found}")
        return found[0]

    def assets(self) -> dict[str, dict[str, Any]]:
        """The file assets of the stack (``<stack>.assets.json``): hash -> source and destination."""
        manifest = next(self.outdir.glob("*.assets.json"))
        return dict(json.loads(manifest.read_text())["files"])


@dataclass
class Resolver:
    """Physical names and values of the template's resources, as CloudFormation gives them."""

    template: Template
    names: dict[str, str] = field(default_factory=dict)

    def physical_name(self, logical_id: str) -> str:
        """A name as CloudFormation generates one: stack name, logical id, a suffix; lower case for buckets."""
        if logical_id not in self.names:
            type_ = self.template.resources[logical_id]["Type"]
            name = f"{STACK_NAME}-{logical_id}-X1"
            self.names[logical_id] = name.lower()[:63] if type_ == "AWS::S3::Bucket" else name[:64]
        return self.names[logical_id]

    def ref(self, logical_id: str) -> str:
        if logical_id in PSEUDO:
            return PSEUDO[logical_id]
        type_ = self.template.resources[logical_id]["Type"]
        name = self.physical_name(logical_id)
        if type_ in ("AWS::S3::Bucket", "AWS::Lambda::Function", "AWS::IAM::Role"):
            return name
        if type_ == "AWS::StepFunctions::StateMachine":
            return f"arn:{PARTITION}:states:{REGION}:{ACCOUNT}:stateMachine:{name}"
        raise UnresolvedToken(f"Ref of {logical_id} ({type_}): not a resource type this resolver knows")

    def get_att(self, logical_id: str, attribute: str) -> str:
        type_ = self.template.resources[logical_id]["Type"]
        name = self.physical_name(logical_id)
        arns = {
            ("AWS::Lambda::Function", "Arn"): f"arn:{PARTITION}:lambda:{REGION}:{ACCOUNT}:function:{name}",
            ("AWS::IAM::Role", "Arn"): f"arn:{PARTITION}:iam::{ACCOUNT}:role/{name}",
            ("AWS::S3::Bucket", "Arn"): f"arn:{PARTITION}:s3:::{name}",
            ("AWS::KMS::Key", "Arn"): f"arn:{PARTITION}:kms:{REGION}:{ACCOUNT}:key/{name}",
        }
        if type_ == "AWS::StepFunctions::StateMachine" and attribute == "Arn":
            return self.ref(logical_id)
        if (type_, attribute) not in arns:
            raise UnresolvedToken(f"Fn::GetAtt {logical_id}.{attribute} ({type_}): not known to this resolver")
        return arns[(type_, attribute)]

    def resolve(self, value: Any) -> Any:
        """``value`` with every intrinsic function replaced by its value."""
        if isinstance(value, list):
            return [self.resolve(item) for item in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            (key, argument), = value.items()
            if key == "Ref":
                return self.ref(argument)
            if key == "Fn::GetAtt":
                return self.get_att(*argument)
            if key == "Fn::Join":
                separator, parts = argument
                return separator.join(str(self.resolve(part)) for part in parts)
            if key == "Fn::Sub" and isinstance(argument, str):
                return _SUB.sub(lambda match: self._sub(match.group(1)), argument)
            if key == "Fn::Select":
                index, items = argument
                return self.resolve(items)[int(index)]
            if key == "Fn::Split":
                separator, text = argument
                return str(self.resolve(text)).split(separator)
            if key.startswith("Fn::"):
                raise UnresolvedToken(f"{key}: an intrinsic function this resolver does not know")
        return {key: self.resolve(item) for key, item in value.items()}

    def _sub(self, name: str) -> str:
        if "." in name:
            logical_id, attribute = name.split(".", 1)
            return self.get_att(logical_id, attribute)
        return self.ref(name)


def _handler_of(properties: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, handler) of a function: an image's CMD runs Python; a zip's Handler runs on its runtime."""
    if properties.get("PackageType") == "Image":
        (command,) = properties["ImageConfig"]["Command"]
        return "python", str(command)
    runtime = str(properties.get("Runtime", ""))
    if not runtime.startswith("nodejs"):
        raise UnresolvedToken(f"function runtime {runtime!r}: the local runtime runs images (Python) and nodejs")
    return "node", str(properties["Handler"])


class LocalDeployment:
    """The template's build resources created in moto (S3, IAM, Lambda, Step Functions)."""

    def __init__(self, template: Template, runtime: LocalLambda) -> None:
        self.template = template
        self.resolver = Resolver(template)
        self.runtime = runtime
        self.s3 = boto3.client("s3", region_name=REGION)
        self.states = boto3.client("stepfunctions", region_name=REGION)
        self.state_machines: dict[str, str] = {}

    def deploy(self) -> LocalDeployment:
        """Publish the file assets, then create the buckets, roles, functions and state machines."""
        resolve = self.resolver.resolve
        for logical_id in self.template.of_type("AWS::S3::Bucket"):
            self.s3.create_bucket(Bucket=self.resolver.ref(logical_id))
        self._publish_assets()
        iam = boto3.client("iam", region_name=REGION)
        for logical_id, role in self.template.of_type("AWS::IAM::Role").items():
            iam.create_role(RoleName=self.resolver.ref(logical_id),
                            AssumeRolePolicyDocument=json.dumps(resolve(role["Properties"]["AssumeRolePolicyDocument"])))
        lambda_client = boto3.client("lambda", region_name=REGION)
        for logical_id, function in self.template.of_type("AWS::Lambda::Function").items():
            properties = {key: resolve(value) for key, value in function["Properties"].items()
                          if key in ("Code", "Role", "Environment", "Timeout", "ImageConfig", "Handler",
                                     "Runtime", "PackageType")}
            kind, handler = _handler_of(properties)
            name = self.resolver.ref(logical_id)
            environment = dict(properties.get("Environment", {}).get("Variables", {}))
            code = {"ImageUri": properties["Code"]["ImageUri"]} if kind == "python" else {"ZipFile": b"local"}
            extra = {"PackageType": "Image"} if kind == "python" else {"Runtime": "nodejs20.x", "Handler": handler}
            lambda_client.create_function(FunctionName=name, Role=properties["Role"], Code=code,
                                          Timeout=int(properties.get("Timeout", 3)), **extra)
            asset = self._asset_dir(properties["Code"]) if kind == "node" else None
            self.runtime.register(Function(name=name, kind=kind, handler=handler, code_dir=asset,
                                           environment=environment, timeout_s=float(properties.get("Timeout", 3))))
        for logical_id, machine in self.template.of_type("AWS::StepFunctions::StateMachine").items():
            properties = machine["Properties"]
            arn = self.states.create_state_machine(
                name=self.resolver.physical_name(logical_id), definition=resolve(properties["DefinitionString"]),
                roleArn=resolve(properties["RoleArn"]),
            )["stateMachineArn"]
            self.state_machines[logical_id] = arn
        return self

    def update(self, template: Template) -> LocalDeployment:
        """The deployed resources with a new template's properties (the next ``cdk deploy`` of the
        same stack: its file assets published, every resource keeping its physical name)."""
        updated = LocalDeployment(template, self.runtime)
        updated.resolver.names = self.resolver.names
        updated.state_machines = self.state_machines
        updated._publish_assets()
        return updated

    def _publish_assets(self) -> None:
        """Upload the file assets as ``cdk deploy`` does (zip assets stay folders: the local runtime runs them)."""
        for asset in self.template.assets().values():
            if asset["source"]["packaging"] != "file" or not asset["source"]["path"].endswith(".yaml"):
                continue
            (destination,) = asset["destinations"].values()
            bucket = self.resolver.resolve({"Fn::Sub": destination["bucketName"]})
            if bucket not in {b["Name"] for b in self.s3.list_buckets()["Buckets"]}:
                self.s3.create_bucket(Bucket=bucket)  # the CDK bootstrap stack's bucket
            self.s3.put_object(Bucket=bucket, Key=destination["objectKey"],
                               Body=(self.template.outdir / asset["source"]["path"]).read_bytes())

    def _asset_dir(self, code: Mapping[str, Any]) -> Path:
        """The staged folder of a zip asset named by a function's ``Code.S3Key``."""
        digest = str(code["S3Key"]).removesuffix(".zip")
        folder = self.template.outdir / self.template.assets()[digest]["source"]["path"]
        if not folder.is_dir():
            raise UnresolvedToken(f"asset {digest}: no staged folder at {folder}")
        return folder

    def state_machine(self, prefix: str) -> str:
        """The ARN of the state machine whose logical id starts with ``prefix``."""
        logical_id = self.template.one("AWS::StepFunctions::StateMachine", prefix)
        return self.state_machines[logical_id]

    def definition(self, prefix: str) -> dict[str, Any]:
        """The resolved definition of a state machine, parsed."""
        logical_id = self.template.one("AWS::StepFunctions::StateMachine", prefix)
        machine = self.template.resources[logical_id]["Properties"]
        return dict(json.loads(self.resolver.resolve(machine["DefinitionString"])))

    def custom_resource_properties(self) -> dict[str, Any]:
        """The ``ResourceProperties`` CloudFormation sends to the model release resource."""
        logical_id = self.template.one("Custom::TritonModelRelease", "ModelBuild")
        return dict(self.resolver.resolve(self.template.resources[logical_id]["Properties"]))
