"""``TritonMultiModelEndpoint.from_endpoint_attributes`` and the client grants (issue 61): a client
stack of the endpoint's app and one of another app grant themselves invoke, each through the real
CDK. The synthesized policies name the endpoint, the routes document, and the key only through S3
(``kms:ViaService``); the policies are evaluated for real requests with tests/policy_eval.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from cdk_helpers import policy_of_role
from policy_eval import decide, resolve

from triton_mme_cdk import ITritonMultiModelEndpoint, ModelSource, PropsError, TritonMultiModelEndpoint
from triton_mme_client import ENV_ENDPOINT_NAME, ENV_REFRESH_SECONDS, ENV_ROUTES_URL, TritonMmeClient

pytestmark = pytest.mark.slow  # real synths (a few seconds each)

ACCOUNT, REGION = "111122223333", "eu-west-1"
ENV = cdk.Environment(account=ACCOUNT, region=REGION)
KEY_ARN = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
VIA_S3 = f"s3.{REGION}.amazonaws.com"
ENDPOINT_ARN = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:endpoint/platform-embeddings"
ROUTES_ARN = "arn:aws:s3:::platform-models/embeddings/_routes/routes.json"


def _function(stack: cdk.Stack, id: str = "Client") -> lambda_.Function:
    return lambda_.Function(stack, id, runtime=lambda_.Runtime.PYTHON_3_14, handler="index.handler",
                            code=lambda_.Code.from_inline("def handler(event, context): return None"))


def _statements(template: dict[str, Any], function: lambda_.Function) -> list[dict[str, Any]]:
    """The statements of the function role's policies, as the template has them."""
    role = cdk.Stack.of(function).resolve(function.role.node.default_child.logical_id)  # type: ignore[union-attr]
    return policy_of_role(template, role)


def _resolved(template: dict[str, Any], function: lambda_.Function) -> list[dict[str, Any]]:
    """The same, with the partition and the other pseudo parameters as the account has them."""
    return [resolve(template, statement) for statement in _statements(template, function)]


def _by_action(statements: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for statement in statements:
        for action in [statement["Action"]] if isinstance(statement["Action"], str) else statement["Action"]:
            found[action] = statement
    return found


def _environment(template: dict[str, Any], function: lambda_.Function) -> dict[str, Any]:
    logical_id = cdk.Stack.of(function).resolve(function.node.default_child.logical_id)  # type: ignore[union-attr]
    return dict(template["Resources"][logical_id]["Properties"]["Environment"]["Variables"])


def _imported(stack: cdk.Stack, id: str = "Embeddings", **options: Any) -> ITritonMultiModelEndpoint:
    attributes: dict[str, Any] = {
        "endpoint_name": "platform-embeddings", "model_prefix": "embeddings",
        "bucket": s3.Bucket.from_bucket_name(stack, f"{id}Bucket", "platform-models"),
        "encryption_key": kms.Key.from_key_arn(stack, f"{id}Key", KEY_ARN), **options}
    return TritonMultiModelEndpoint.from_endpoint_attributes(stack, id, **attributes)


@pytest.fixture(scope="module")
def other_app(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Another app's stack: the endpoint from its name, bucket, key and prefix; a function connected."""
    app = cdk.App(outdir=str(tmp_path_factory.mktemp("other-app")), analytics_reporting=False)
    stack = cdk.Stack(app, "TeamClient", env=ENV)
    endpoint = _imported(stack)
    function = _function(stack)
    grant = endpoint.connect_client(function, refresh=cdk.Duration.seconds(10))
    template = app.synth().get_stack_by_name("TeamClient").template
    return {"endpoint": endpoint, "function": function, "grant": grant, "template": template}


def test_another_apps_function_may_invoke_read_the_routes_and_decrypt_through_s3(other_app: dict[str, Any]) -> None:
    assert other_app["grant"].success
    statements = _resolved(other_app["template"], other_app["function"])
    actions = _by_action(statements)
    assert set(actions) == {"sagemaker:InvokeEndpoint", "s3:GetObject", "kms:Decrypt"}
    assert actions["sagemaker:InvokeEndpoint"]["Resource"] == ENDPOINT_ARN
    assert actions["s3:GetObject"]["Resource"] == ROUTES_ARN
    assert actions["kms:Decrypt"]["Resource"] == KEY_ARN
    assert actions["kms:Decrypt"]["Condition"] == {"StringEquals": {"kms:ViaService": VIA_S3}}
    # The policy, evaluated: what the client does is allowed, and nothing beside it.
    allowed = {
        ("sagemaker:InvokeEndpoint", ENDPOINT_ARN, ()),
        ("s3:GetObject", ROUTES_ARN, ()),
        ("kms:Decrypt", KEY_ARN, (("kms:ViaService", VIA_S3),)),
    }
    refused = {
        ("sagemaker:InvokeEndpoint", ENDPOINT_ARN.replace("platform-embeddings", "other"), ()),
        ("s3:GetObject", "arn:aws:s3:::platform-models/embeddings/served/minilm-0123456789ab.tar.gz", ()),
        ("s3:PutObject", ROUTES_ARN, ()),
        ("kms:Decrypt", KEY_ARN, ()),  # directly, not through S3
        ("kms:Decrypt", KEY_ARN, (("kms:ViaService", "s3.us-east-1.amazonaws.com"),)),
    }
    for action, resource, request in allowed | refused:
        decision = decide(action, resource, dict(request), identity=statements)
        assert decision == ("Allow" if (action, resource, request) in allowed else "ImplicitDeny"), (action, resource)


def test_connect_client_sets_what_from_env_reads(other_app: dict[str, Any]) -> None:
    environment = _environment(other_app["template"], other_app["function"])
    assert environment == {ENV_ENDPOINT_NAME: "platform-embeddings",
                           ENV_ROUTES_URL: "s3://platform-models/embeddings/_routes/routes.json",
                           ENV_REFRESH_SECONDS: "10"}
    # The client itself reads them (no call is made: the routes are read on first use).
    client = TritonMmeClient.from_env(environment, runtime=object(), s3=object())
    assert (client.endpoint_name, client.routes_url, client.resolver._refresh) == (
        "platform-embeddings", "s3://platform-models/embeddings/_routes/routes.json", 10.0)


def test_the_imported_endpoints_attributes_and_metrics(other_app: dict[str, Any]) -> None:
    endpoint = other_app["endpoint"]
    assert isinstance(endpoint, ITritonMultiModelEndpoint)
    stack = cdk.Stack.of(other_app["function"])
    assert endpoint.endpoint_name == "platform-embeddings"
    assert resolve(other_app["template"], stack.resolve(endpoint.endpoint_arn)) == ENDPOINT_ARN
    assert (endpoint.routes_bucket_name, endpoint.routes_key) == ("platform-models", "embeddings/_routes/routes.json")
    assert endpoint.routes_url == "s3://platform-models/embeddings/_routes/routes.json"
    for metric, namespace in ((endpoint.metric_invocations(), "AWS/SageMaker"),
                              (endpoint.metric_gpu_memory_utilization(), "/aws/sagemaker/Endpoints")):
        assert metric.namespace == namespace
        assert metric.dimensions == {"EndpointName": "platform-embeddings", "VariantName": "AllTraffic"}


@pytest.fixture(scope="module")
def same_app(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The endpoint's own app: the endpoint in one stack, a client in a second stack twice over,
    once with the construct itself and once with the endpoint imported from its attributes."""
    app = cdk.App(outdir=str(tmp_path_factory.mktemp("same-app")), analytics_reporting=False)
    platform = cdk.Stack(app, "Platform", env=ENV)
    endpoint = TritonMultiModelEndpoint(platform, "Embeddings", models=ModelSource.from_release("r-0123456789abcdef"),
                                        endpoint_name="platform-embeddings", model_prefix="embeddings",
                                        model_publishers=[iam.Role.from_role_arn(
                                            platform, "Publisher", f"arn:aws:iam::{ACCOUNT}:role/publisher")])
    clients = cdk.Stack(app, "Clients", env=ENV)
    direct, imported = _function(clients, "Direct"), _function(clients, "Imported")
    endpoint.connect_client(direct)
    _imported(clients, bucket=endpoint.bucket, encryption_key=endpoint.encryption_key).connect_client(imported)
    assembly = app.synth()
    return {"endpoint": endpoint, "platform": platform, "direct": direct, "imported": imported,
            "platform_template": assembly.get_stack_by_name("Platform").template,
            "template": assembly.get_stack_by_name("Clients").template}


def test_a_second_stack_of_the_app_gets_the_same_grants(same_app: dict[str, Any]) -> None:
    """The construct's own grant (through cross-stack references) and the imported endpoint's name
    the same endpoint, routes document and key, the key through S3 only."""
    platform, resources = same_app["platform_template"], same_app["platform_template"]["Resources"]
    # The bucket's key (the other is the created alarm topic's: issue 59).
    [key] = [lid for lid, r in resources.items() if r["Type"] == "AWS::KMS::Key" and "AlarmTopic" not in lid]
    [bucket] = [lid for lid, r in resources.items() if r["Type"] == "AWS::S3::Bucket"
                and "AccessLogs" not in lid]
    [endpoint] = [lid for lid, r in resources.items() if r["Type"] == "AWS::SageMaker::Endpoint"]
    exported = {output.get("Export", {}).get("Name"): output["Value"] for output in platform.get("Outputs", {}).values()}

    def imported_value(value: Any) -> Any:
        return exported[value["Fn::ImportValue"]] if isinstance(value, dict) and "Fn::ImportValue" in value else value

    for name in ("direct", "imported"):
        actions = _by_action(_statements(same_app["template"], same_app[name]))
        assert set(actions) == {"sagemaker:InvokeEndpoint", "s3:GetObject", "kms:Decrypt"}, name
        invoke = imported_value(actions["sagemaker:InvokeEndpoint"]["Resource"])
        # The construct names its endpoint resource; the import, the ARN SageMaker gives it.
        expected = {"Fn::GetAtt": [endpoint, "EndpointArn"]} if name == "direct" else ENDPOINT_ARN
        assert (invoke if name == "direct" else resolve(same_app["template"], invoke)) == expected, name
        routes = actions["s3:GetObject"]["Resource"]["Fn::Join"][1]
        assert imported_value(routes[0]) == {"Fn::GetAtt": [bucket, "Arn"]}, name
        assert routes[1] == "/embeddings/_routes/routes.json", name
        assert imported_value(actions["kms:Decrypt"]["Resource"]) == {"Fn::GetAtt": [key, "Arn"]}, name
        condition = resolve(same_app["template"], actions["kms:Decrypt"]["Condition"])
        assert condition == {"StringEquals": {"kms:ViaService": VIA_S3}}, name
        environment = _environment(same_app["template"], same_app[name])
        assert set(environment) == {ENV_ENDPOINT_NAME, ENV_ROUTES_URL}, name
    created = same_app["endpoint"]
    assert created.routes_key == "embeddings/_routes/routes.json"
    assert same_app["platform"].resolve(created.routes_bucket_name) == {"Ref": bucket}


def test_a_name_with_capitals_is_granted_as_sagemaker_writes_its_arn(tmp_path: Path) -> None:
    app = cdk.App(outdir=str(tmp_path), analytics_reporting=False)
    stack = cdk.Stack(app, "Caps", env=ENV)
    endpoint = _imported(stack, endpoint_name="Platform-Embeddings")
    function = _function(stack)
    endpoint.grant_invoke(function)
    template = app.synth().get_stack_by_name("Caps").template
    invoke = _by_action(_resolved(template, function))["sagemaker:InvokeEndpoint"]["Resource"]
    assert invoke == [ENDPOINT_ARN, ENDPOINT_ARN.replace("platform-embeddings", "Platform-Embeddings")]
    assert resolve(template, stack.resolve(endpoint.endpoint_arn)) == ENDPOINT_ARN


def test_a_name_known_at_deploy_only_is_used_as_given(tmp_path: Path) -> None:
    """A name that is a token (another stack's export, here) cannot be lowercased at synth: the ARN
    names it as given, and the metrics and the environment carry the same token."""
    app = cdk.App(outdir=str(tmp_path), analytics_reporting=False)
    stack = cdk.Stack(app, "Exported", env=ENV)
    name = cdk.Fn.import_value("PlatformEndpointName")
    endpoint = _imported(stack, endpoint_name=name, variant_name="Blue")
    function = _function(stack)
    endpoint.connect_client(function)
    template = app.synth().get_stack_by_name("Exported").template
    invoke = _by_action(_statements(template, function))["sagemaker:InvokeEndpoint"]["Resource"]
    assert invoke["Fn::Join"][1][-1] == {"Fn::ImportValue": "PlatformEndpointName"}
    assert _environment(template, function)[ENV_ENDPOINT_NAME] == {"Fn::ImportValue": "PlatformEndpointName"}
    assert stack.resolve((endpoint.metric_invocations().dimensions or {})["VariantName"]) == "Blue"


def test_an_environment_agnostic_stack_names_its_own_region(tmp_path: Path) -> None:
    app = cdk.App(outdir=str(tmp_path), analytics_reporting=False)
    stack = cdk.Stack(app, "Anywhere")
    function = _function(stack)
    _imported(stack).grant_invoke(function)
    template = app.synth().get_stack_by_name("Anywhere").template
    condition = _by_action(_statements(template, function))["kms:Decrypt"]["Condition"]
    assert condition == {"StringEquals": {"kms:ViaService": {"Fn::Join": ["", [
        "s3.", {"Ref": "AWS::Region"}, ".", {"Ref": "AWS::URLSuffix"}]]}}}


def _refusal(case: str) -> None:
    stack = cdk.Stack(cdk.App(), "Refused", env=ENV)
    if case == "no-key":
        _imported(stack, encryption_key=None)
    elif case == "bad-name":
        _imported(stack, endpoint_name="platform_embeddings")
    elif case == "bad-prefix":
        _imported(stack, model_prefix="/embeddings/")
    elif case == "not-a-bucket":
        _imported(stack, bucket="platform-models")
    elif case == "not-a-function":
        _imported(stack).connect_client(iam.Role(stack, "Role", assumed_by=iam.AccountRootPrincipal()))  # type: ignore[arg-type]
    elif case == "refresh-below-a-second":
        _imported(stack).connect_client(_function(stack), refresh=cdk.Duration.millis(500))
    raise AssertionError(f"{case}: not refused")


@pytest.mark.parametrize(("case", "expected"), [
    ("no-key", "encryption_key: missing, and the bucket carries no key;"),
    ("bad-name", "endpoint_name: got 'platform_embeddings'; expected 1 to 63 letters"),
    ("bad-prefix", "model_prefix: got '/embeddings/'; expected an S3 key prefix"),
    ("not-a-bucket", "bucket: got str; expected IBucket"),
    ("not-a-function", "function: got Role; expected a lambda_.Function"),
    ("refresh-below-a-second", "refresh: got 0.5 s; expected at least 1 s"),
])
def test_bad_input_is_one_line_naming_the_keyword(case: str, expected: str) -> None:
    with pytest.raises(PropsError) as caught:
        _refusal(case)
    message = str(caught.value)
    assert message.startswith(expected), message
    assert "\n" not in message
