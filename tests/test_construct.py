"""``TritonMultiModelEndpoint`` in stacks of one's own (issue 48): your bucket, key, VPC and topic; a
function granted invoke; two endpoints in one stack; a CDK Pipelines ``Stage``; the metrics; bad
input as one line at synth; and the upgrade of an existing deployment (the project's own ``plan``
against the template the previous version synthesized).

Everything is synthesized for real (aws-cdk-lib through jsii); nothing is deployed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from cdk_helpers import synth
from cdk_nag import AwsSolutionsChecks

from triton_mme_cdk import ModelSource, PropsError, TritonMultiModelEndpoint
from triton_mme_cdk.model_build.release.deployed import check_embedded, parse_record

ROOT = Path(__file__).resolve().parents[1]
#: The default app's template as version 0.1.0 synthesized it (before the construct), for the upgrade.
PREVIOUS_TEMPLATE = ROOT / "tests" / "snapshots" / "TritonMme.0.1.0.template.json"

pytestmark = pytest.mark.slow  # real synths (a few seconds each)


def _synthetic_manifest(folder: Path, name: str, copies: int = 1) -> Path:
    """A manifest of one synthetic ResNet (no file, no download)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps({"version": 1, "models": [{
        "name": name, "source": {"kind": "synthetic", "architecture": "resnet", "seed": 0, "config": {
            "embedding_size": 8, "hidden_sizes": [8, 8, 8, 8], "depths": [1, 1, 1, 1], "layer_type": "basic",
            "num_labels": 4}},
        "task": "image-classification", "format": "onnx", "max_batch_size": 4,
        "image": {"image_size": 32, "channels": 3}, "copies": copies}]}))
    return path


def _logical_id(construct: Any) -> str:
    """The logical id of a construct's CloudFormation resource (its default child)."""
    resource = construct.node.default_child
    assert isinstance(resource, cdk.CfnElement)
    return str(cdk.Stack.of(construct).resolve(resource.logical_id))


def _resources(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {lid: r for lid, r in template["Resources"].items() if r["Type"] == kind}


class PlatformStack(cdk.Stack):
    """A platform team's stack: its key, isolated VPC, bucket and topic; the endpoint; a client."""

    def __init__(self, scope: cdk.App | cdk.Stage, id: str, manifest: Path, **options: Any) -> None:
        super().__init__(scope, id)
        self.key = kms.Key(self, "PlatformKey", enable_key_rotation=True)
        self.vpc = ec2.Vpc(self, "Vpc", max_azs=2, nat_gateways=0, subnet_configuration=[
            ec2.SubnetConfiguration(name="isolated", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)])
        self.bucket = s3.Bucket(self, "Models", encryption=s3.BucketEncryption.KMS, encryption_key=self.key,
                                enforce_ssl=True, versioned=True)
        self.topic = sns.Topic(self, "Alarms", master_key=self.key)
        self.endpoint = TritonMultiModelEndpoint(
            self, "Embeddings", models=ModelSource.from_manifest(manifest), bucket=self.bucket, vpc=self.vpc,
            alarm_topic=self.topic, endpoint_name="platform-embeddings", model_prefix="embeddings", **options)
        self.client = lambda_.Function(self, "Client", runtime=lambda_.Runtime.PYTHON_3_14, handler="index.handler",
                                       code=lambda_.Code.from_inline("def handler(event, context): return None"))
        self.grant = self.endpoint.grant_invoke(self.client)


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> tuple[PlatformStack, dict[str, Any], Path]:
    work = tmp_path_factory.mktemp("platform")
    app = cdk.App(outdir=str(work / "out"), analytics_reporting=False)
    stack = PlatformStack(app, "Platform", _synthetic_manifest(work, "resnet"))
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    try:
        app.synth()
    except RuntimeError as error:  # cdk-nag failed the synth: the findings are in the report
        assert "ValidationFailed" in str(error), error
    template = json.loads((work / "out" / "Platform.template.json").read_text())
    return stack, template, work / "out"


def test_your_bucket_key_vpc_and_topic_are_used_and_none_is_created(
        platform: tuple[PlatformStack, dict[str, Any], Path]) -> None:
    stack, template, _ = platform
    resolve = stack.resolve
    bucket, key = resolve(stack.bucket.bucket_name), resolve(stack.key.key_arn)
    # The construct created no bucket and no key: the two are the team's.
    assert list(_resources(template, "AWS::S3::Bucket")) == [_logical_id(stack.bucket)]
    assert list(_resources(template, "AWS::KMS::Key")) == [_logical_id(stack.key)]
    (model,) = _resources(template, "AWS::SageMaker::Model").values()
    assert model["Properties"]["PrimaryContainer"]["ModelDataUrl"] == {
        "Fn::Join": ["", ["s3://", bucket, "/embeddings/served/"]]}
    subnets = [resolve(subnet.subnet_id) for subnet in stack.vpc.isolated_subnets]
    assert model["Properties"]["VpcConfig"]["Subnets"] == subnets
    statements = [s for policy in _resources(template, "AWS::IAM::Policy").values()
                  for s in policy["Properties"]["PolicyDocument"]["Statement"]]
    kms_resources = [s["Resource"] for s in statements if any(str(a).startswith("kms:") for a in
                                                              ([s["Action"]] if isinstance(s["Action"], str)
                                                               else s["Action"]))]
    assert kms_resources and all(resource == key for resource in kms_resources), kms_resources
    topic = resolve(stack.topic.topic_arn)
    alarms = _resources(template, "AWS::CloudWatch::Alarm").values()
    assert alarms and all(alarm["Properties"]["AlarmActions"] == [topic] for alarm in alarms)


def test_a_function_granted_invoke_may_invoke_and_read_the_routes(
        platform: tuple[PlatformStack, dict[str, Any], Path]) -> None:
    stack, template, _ = platform
    assert isinstance(stack.grant, iam.Grant) and stack.grant.success
    role = stack.resolve(stack.client.role.node.default_child.logical_id)  # type: ignore[union-attr]
    (policy,) = [p for p in _resources(template, "AWS::IAM::Policy").values()
                 if p["Properties"]["Roles"] == [{"Ref": role}]]
    statements = {s["Action"]: s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    actions = {action: statement["Resource"] for action, statement in statements.items()}
    assert actions["sagemaker:InvokeEndpoint"] == stack.resolve(stack.endpoint.endpoint_arn)
    assert actions["s3:GetObject"] == {"Fn::Join": ["", [stack.resolve(stack.bucket.bucket_arn),
                                                         "/embeddings/_routes/routes.json"]]}
    assert actions["kms:Decrypt"] == stack.resolve(stack.key.key_arn)
    # The key only through S3, as the bucket's own grants (issue 61: it had no condition).
    assert statements["kms:Decrypt"]["Condition"] == {"StringEquals": {"kms:ViaService": {"Fn::Join": ["", [
        "s3.", {"Ref": "AWS::Region"}, ".", {"Ref": "AWS::URLSuffix"}]]}}}


def test_cdk_nag_finds_nothing_on_the_constructs_resources(
        platform: tuple[PlatformStack, dict[str, Any], Path]) -> None:
    """The team's own resources are the team's business (the test's VPC has no flow log, its
    function a managed policy); nothing under the endpoint's construct may be reported."""
    _, _, out = platform
    report = out / "validation-report.json"
    paths = []
    if report.exists():
        for plugin in json.loads(report.read_text())["pluginReports"]:
            for violation in plugin["violations"]:
                paths += [(violation["ruleName"], c["constructPath"]) for c in violation.get("violatingConstructs", [])]
    assert paths, "the team's own resources have findings: the report was read"
    assert not [p for p in paths if p[1].startswith("Platform/Embeddings")], paths


def test_metrics_are_named_after_the_services_metrics(platform: tuple[PlatformStack, dict[str, Any], Path]) -> None:
    stack, _, _ = platform
    endpoint = stack.endpoint
    names = {
        "metric_invocations": ("AWS/SageMaker", "Invocations"),
        "metric_model_latency": ("AWS/SageMaker", "ModelLatency"),
        "metric_model_cache_hit": ("AWS/SageMaker", "ModelCacheHit"),
        "metric_gpu_utilization": ("/aws/sagemaker/Endpoints", "GPUUtilization"),
        "metric_gpu_memory_utilization": ("/aws/sagemaker/Endpoints", "GPUMemoryUtilization"),
        "metric_loaded_model_count": ("/aws/sagemaker/Endpoints", "LoadedModelCount"),
    }
    for method, (namespace, name) in names.items():
        metric = getattr(endpoint, method)()
        assert (metric.namespace, metric.metric_name) == (namespace, name), method
        assert metric.dimensions["EndpointName"] == "platform-embeddings"


def test_two_endpoints_in_one_stack_each_with_its_manifest_and_record(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    app = cdk.App(outdir=str(tmp_path / "out"), analytics_reporting=False)
    stack = cdk.Stack(app, "Fleet")
    small = TritonMultiModelEndpoint(
        stack, "Small", models=ModelSource.from_manifest(_synthetic_manifest(tmp_path / "s", "small", copies=3)),
        endpoint_name="small-models", model_prefix="small", instance_type="ml.g4dn.xlarge")
    big = TritonMultiModelEndpoint(
        stack, "Big", models=ModelSource.from_manifest(_synthetic_manifest(tmp_path / "b", "big")),
        endpoint_name="big-models", model_prefix="big", instance_type="ml.g5.2xlarge", max_instance_count=2)
    template = app.synth().get_stack_by_name("Fleet").template
    configs = _resources(template, "AWS::SageMaker::EndpointConfig").values()
    assert sorted(c["Properties"]["ProductionVariants"][0]["InstanceType"] for c in configs) == [
        "ml.g4dn.xlarge", "ml.g5.2xlarge"]
    releases = _resources(template, "Custom::TritonModelRelease")
    assert sorted(r["Properties"]["ModelPrefix"] for r in releases.values()) == ["big", "small"]
    assert small.release_id != big.release_id
    # Each endpoint's record covers its own fleet, not the other's; together they cover the template.
    check_embedded(template)
    endpoints = {_logical_id(e.endpoint): e for e in (small, big)}
    for release in releases.values():
        recorded = set(parse_record(release["Properties"]["Deployed"], where="test")["resources"])
        own = [lid for lid in endpoints if lid in recorded]
        assert len(own) == 1, (own, sorted(recorded))
    # The plan of one endpoint compares its live record with its own record in the new template:
    # the other endpoint's fleet is not "created" by this change.
    from triton_mme_cdk.model_build.__main__ import main
    from triton_mme_cdk.model_build.release.routes import Routes

    small_release = next(r for r in releases.values() if r["Properties"]["ModelPrefix"] == "small")
    routes = Routes(small.release_id, "s3://b/small/served/", "k", {},
                    stack="arn:aws:cloudformation:eu-west-1:123456789012:stack/Fleet/0a1b2c3d",
                    model_code_sha256="0" * 64,
                    deployed=parse_record(small_release["Properties"]["Deployed"], where="test"))
    (tmp_path / "routes.json").write_bytes(routes.body())
    (tmp_path / "fleet.json").write_text(json.dumps(template))
    monkeypatch.chdir(tmp_path)  # plan reads ./cdk.json: here none, the template is given
    args = ["plan", "--format", "json", "--routes-file", str(tmp_path / "routes.json"),
            "--template", str(tmp_path / "fleet.json"), "-c", "mme:stack_name=Fleet",
            "--manifest", str(tmp_path / "s" / "small.yaml")]
    assert main([*args]) == 1  # two endpoints, no --prefix: which one is asked, one line
    assert "give --prefix PREFIX" in capsys.readouterr().err
    main([*args, "--prefix", "small"])
    report = json.loads(capsys.readouterr().out)
    assert (report["fleet"]["verdict"], report["data"]["verdict"]) == ("unchanged", "safe"), report["summary"]
    # Unscoped, the whole template against one endpoint's record: the other fleet reads as a change.
    from triton_mme_cdk.model_build.tools.review.plan_verdict import judge

    assert judge(template, record=routes.deployed, live_routes=True).fleet != "unchanged"


def test_in_a_cdk_pipelines_stage(tmp_path: Path) -> None:
    app = cdk.App(outdir=str(tmp_path / "out"), analytics_reporting=False)
    stage = cdk.Stage(app, "Prod", env=cdk.Environment(account="123456789012", region="eu-west-1"))
    PlatformStack(stage, "Platform", _synthetic_manifest(tmp_path, "resnet"))
    assembly = app.synth()
    stage_assembly = assembly.get_nested_assembly(f"assembly-{stage.node.path}")
    template = stage_assembly.get_stack_by_name("Prod-Platform").template
    assert _resources(template, "AWS::SageMaker::Endpoint")


def test_your_subnets_and_security_groups_are_the_models(tmp_path: Path) -> None:
    app = cdk.App(outdir=str(tmp_path / "out"), analytics_reporting=False)
    stack = cdk.Stack(app, "Chosen")
    vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=0, subnet_configuration=[
        ec2.SubnetConfiguration(name="models", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED),
        ec2.SubnetConfiguration(name="other", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)])
    group = ec2.SecurityGroup(stack, "Theirs", vpc=vpc, allow_all_outbound=False)
    endpoint = TritonMultiModelEndpoint(
        stack, "Mme", models=ModelSource.from_release("r-0123456789abcdef"), vpc=vpc,
        vpc_subnets=ec2.SubnetSelection(subnet_group_name="models"), security_groups=[group])
    template = app.synth().get_stack_by_name("Chosen").template
    (model,) = _resources(template, "AWS::SageMaker::Model").values()
    chosen = vpc.select_subnets(subnet_group_name="models").subnets
    assert model["Properties"]["VpcConfig"]["Subnets"] == [stack.resolve(s.subnet_id) for s in chosen]
    assert model["Properties"]["VpcConfig"]["SecurityGroupIds"] == [stack.resolve(group.security_group_id)]
    assert endpoint.network is not None and endpoint.network.model_security_group is None


def test_from_release_serves_without_a_build(tmp_path: Path) -> None:
    app = cdk.App(outdir=str(tmp_path / "out"), analytics_reporting=False)
    stack = cdk.Stack(app, "Served")
    endpoint = TritonMultiModelEndpoint(stack, "Mme", models=ModelSource.from_release("r-0123456789abcdef"))
    template = app.synth().get_stack_by_name("Served").template
    assert not _resources(template, "Custom::TritonModelRelease") and endpoint.build is None
    assert endpoint.release_id == "r-0123456789abcdef"


def _refusal(tmp_path: Path, case: str) -> str:
    stack = cdk.Stack(cdk.App(outdir=str(tmp_path / "out")), "Refused")
    release = ModelSource.from_release("r-0123456789abcdef")
    if case == "bucket-without-key":
        bucket = s3.Bucket.from_bucket_name(stack, "Theirs", "their-models")
        TritonMultiModelEndpoint(stack, "Mme", models=release, bucket=bucket)
    elif case == "vpc-without-private-subnets":
        vpc = ec2.Vpc(stack, "Public", max_azs=2, nat_gateways=0, subnet_configuration=[
            ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC)])
        TritonMultiModelEndpoint(stack, "Mme", models=release, vpc=vpc)
    elif case == "missing-manifest":
        ModelSource.from_manifest(tmp_path / "no-such-models.yaml")
    elif case == "not-a-release-id":
        ModelSource.from_release("release-1")
    elif case == "two-endpoints-one-name":
        TritonMultiModelEndpoint(stack, "One", models=release, endpoint_name="shared")
        TritonMultiModelEndpoint(stack, "Two", models=release, endpoint_name="shared", model_prefix="two")
    elif case == "one-bucket-one-prefix":
        key = kms.Key(stack, "Key")
        shared = s3.Bucket(stack, "Shared", encryption=s3.BucketEncryption.KMS, encryption_key=key)
        TritonMultiModelEndpoint(stack, "One", models=release, bucket=shared, endpoint_name="one")
        TritonMultiModelEndpoint(stack, "Two", models=release, bucket=shared, endpoint_name="two")
    elif case == "unknown-keyword":
        TritonMultiModelEndpoint(stack, "Mme", models=release, instace_type="ml.g5.xlarge")  # type: ignore[call-arg]
    elif case == "bad-value":
        TritonMultiModelEndpoint(stack, "Mme", models=release, max_instance_count=0)
    elif case == "subnets-without-vpc":
        TritonMultiModelEndpoint(stack, "Mme", models=release,
                                 vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_ISOLATED))
    raise AssertionError(f"{case}: not refused")


@pytest.mark.parametrize(("case", "expected"), [
    ("bucket-without-key", "encryption_key: missing with bucket 'their-models'; "),
    ("vpc-without-private-subnets", "vpc: Refused/Public has no isolated or private subnets in two Availability Zones"),
    ("missing-manifest", "models: ModelSource.from_manifest got "),
    ("not-a-release-id", "models: ModelSource.from_release got 'release-1'; expected a release id"),
    ("two-endpoints-one-name", "endpoint_name: got 'shared' for Refused/Two, but Refused/One in the same stack has it"),
    ("one-bucket-one-prefix", "model_prefix: got 'models' for Refused/Two, but Refused/One serves from the same bucket"),
    ("unknown-keyword", "instace_type: unknown keyword; did you mean instance_type?"),
    ("bad-value", "max_instance_count: got 0;"),
    ("subnets-without-vpc", "vpc_subnets: given without vpc;"),
])
def test_bad_input_is_one_line_naming_the_prop(tmp_path: Path, case: str, expected: str) -> None:
    with pytest.raises(PropsError) as caught:
        _refusal(tmp_path, case)
    message = str(caught.value)
    assert message.startswith(expected), message
    assert "\n" not in message


@pytest.mark.parametrize(("keywords", "expected"), [
    ({"rollout_wait": 600}, "rollout_wait: got 600; expected a Duration: pass Duration.seconds(600)"),
    ({"build_memory": 4096}, "build_memory: got 4096; expected a Size: pass Size.mebibytes(4096)"),
    ({"unrouted_retention": "7"}, "unrouted_retention: got '7'; expected a Duration: pass Duration.days(...)"),
    ({"rollout_wait": cdk.Size.gibibytes(1)}, "rollout_wait: got a Size; expected a Duration: pass Duration.seconds(...)"),
    ({"rollout_wait": cdk.Token.as_number(cdk.Fn.ref("Wait"))},
     "rollout_wait: got a token; expected a Duration: pass Duration.seconds(token)"),
    ({"build_query_interval_seconds": 30},
     "build_query_interval_seconds: renamed build_query_interval, a Duration: pass "
     "build_query_interval=Duration.seconds(30)"),
    ({"rollout_wait": cdk.Duration.hours(2)}, "rollout_wait: got 7200 s; expected 0 to 3600 s"),
    ({"alarm_latency_p99": cdk.Duration.millis(0)}, "alarm_latency_p99: got 0 ms; expected more than 0 to 3.6e+06 ms"),
    ({"volume_size": cdk.Size.mebibytes(1500), "instance_type": "ml.p3.2xlarge"},
     "volume_size: got 1.46484 GiB; expected a whole number of GiB"),
    ({"volume_size": cdk.Size.gibibytes(50)},
     "volume_size: got 50 with instance_type ml.g5.xlarge; g4dn and g5 instances serve from their local instance"),
    ({"build_total_timeout": cdk.Duration.minutes(10), "build_query_interval": cdk.Duration.seconds(45)},
     "build_total_timeout: got 10 minutes with build_query_interval 45 seconds; the total timeout must be a whole "
     "multiple of the query interval"),
])
def test_a_time_or_size_keyword_takes_a_duration_or_size(keywords: dict[str, Any], expected: str) -> None:
    """Times and sizes are Duration and Size keywords without the unit in their name (issue 60): a
    number (a token too), a string, the other kind, an old name or a value out of bounds is one line
    naming the keyword and what to pass; a rule between two of them names both keywords."""
    stack = cdk.Stack(cdk.App(analytics_reporting=False), "Typed")
    with pytest.raises(PropsError) as caught:
        TritonMultiModelEndpoint(stack, "Mme", models=ModelSource.from_release("r-0123456789abcdef"), **keywords)
    assert str(caught.value).startswith(expected), str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_time_given_as_a_token_is_not_checked_at_synth() -> None:
    """A Duration whose amount is a token (known at deploy) skips the bounds and the rules."""
    from triton_mme_cdk.constructs.endpoint_settings import endpoint_settings

    wait = cdk.Duration.seconds(cdk.Token.as_number(cdk.Fn.ref("Wait")))
    interval = cdk.Duration.seconds(cdk.Token.as_number(cdk.Fn.ref("Interval")))
    options = endpoint_settings({"rollout_wait": wait, "build_query_interval": interval}, has_vpc=False)
    assert options.rollout_wait is wait and options.build_query_interval is interval


def test_the_upgrade_from_0_1_0_replaces_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The default app's template keeps every logical id of the template 0.1.0 synthesized (its
    stack built the resources itself; now it holds the construct as ``Default``), and adds only the
    build's second role and function: the project's
    own plan of the new template against the previous one finds no data at risk and no fleet
    replaced. Only the build code moved (model keys and the release id with it: models-only)."""
    from triton_mme_cdk.model_build.__main__ import main
    from triton_mme_cdk.model_build.release.deployed import record_from_template
    from triton_mme_cdk.model_build.release.routes import Routes

    previous = json.loads(PREVIOUS_TEMPLATE.read_text())
    current = synth(tmp_path / "current", nag=False).data
    kept = set(previous["Resources"]) - {"CDKMetadata"}
    assert kept <= set(current["Resources"]), kept - set(current["Resources"])
    # Added since: the build step's own role and the placing function (issue 49: the code that
    # parses model sources no longer shares the placing role), and the policy that lets the handlers
    # read their own stack's tag to check an event against CloudFormation (issue 62); the alarm topic,
    # its key and its policy (issue 59: the alarms notify a created topic unless one is given).
    added = {logical_id.rstrip("0123456789ABCDEF") for logical_id in set(current["Resources"]) - kept - {"CDKMetadata"}}
    assert added == {"ModelBuildBuildRole", "ModelBuildBuildRoleDefaultPolicy", "ModelBuildPlace", "ModelBuildPlaceLogs",
                     "ModelBuildCheckRequests", "AlarmTopic", "AlarmTopicKey", "AlarmTopicPolicy"}
    routes = Routes("r-0000000000000000", "s3://b/models/served/", "k", {},
                    stack="arn:aws:cloudformation:eu-west-1:123456789012:stack/TritonMme/0a1b2c3d",
                    model_code_sha256="0" * 64, deployed=record_from_template(previous))
    (tmp_path / "routes.json").write_bytes(routes.body())
    (tmp_path / "current.json").write_text(json.dumps(current))
    code = main(["plan", "--format", "json", "--routes-file", str(tmp_path / "routes.json"),
                 "--template", str(tmp_path / "current.json"), "--deployed-template", str(PREVIOUS_TEMPLATE)])
    report = json.loads(capsys.readouterr().out)
    assert report["data"]["verdict"] == "safe", report["data"]
    assert report["fleet"]["verdict"] in ("unchanged", "updated"), report["fleet"]
    assert report["verdict"] not in ("data-at-risk", "fleet-replaced"), report["summary"]
    assert code == 0


def test_reading_an_attribute_adds_nothing_to_the_tree(tmp_path: Path) -> None:
    """Every public property of the construct read, some twice: the tree is the same construct
    for construct, and ``dashboard_url`` reads the console domains the construct already holds
    (issue 60; it used to add that mapping on its first read)."""
    app = cdk.App(outdir=str(tmp_path / "out"), analytics_reporting=False)
    stack = cdk.Stack(app, "Reader")
    endpoint = TritonMultiModelEndpoint(stack, "Endpoint",
                                        models=ModelSource.from_manifest(_synthetic_manifest(tmp_path, "reader")))
    tree = [child.node.path for child in stack.node.find_all()]
    assert "Reader/Endpoint/ConsoleDomains" in tree
    properties = [name for name, value in vars(TritonMultiModelEndpoint).items()
                  if isinstance(value, property) and not name.startswith("_")]
    assert {"dashboard_url", "endpoint_name", "bucket", "encryption_key"} <= set(properties)
    for _ in range(2):
        for name in properties:
            getattr(endpoint, name)
    assert [child.node.path for child in stack.node.find_all()] == tree
