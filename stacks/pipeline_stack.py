"""The opt-in delivery pipeline (``mme:pipeline``): CDK Pipelines on CodePipeline V2, one set of
CodePipeline stages per target, in order, stopping only for what needs a person.

Before ``UpdatePipeline`` (self-mutation), ``PipelineChange`` and ``PipelineChange-approve``
hold a change of the pipeline's own definition for a person (``stacks/pipeline_hold.py``).

Per target (``<name>``):

1. ``<name>-plan``: ``python -m model_build plan`` of the synthesized template against the live
   routes and the deployed template, and the access stack's template against its deployed one;
   keeps ``plan.md`` and ``plan.json`` as the step's output and exports ``PLAN_VERDICT`` (and
   ``PLAN_APPROVAL``: ``true`` where plan would exit 4, where the access stack's roles change or
   the plan's read-only role cannot be assumed, or for every deploy of a stage with
   ``require_approval: always``).
2. ``<name>-approve``: a manual approval, **entered only when the verdict needs a person**
   (data at risk, fleet replaced or unknown, access widened or changed in a way the plan cannot
   classify: plan's exit 4; every deploy with ``require_approval: always``): a CodePipeline V2 ``beforeEntry``
   condition with a ``VariableCheck`` rule on ``PLAN_APPROVAL``, result ``SKIP``. It links the
   plan's build (its log holds the markdown) and notifies ``approval_topic_arn``.
3. ``<name>``: deploys the endpoint stack and ``<stack>-<name>-pipeline-access``, a small stack
   with the **read-only roles** the plan and smoke steps assume (after the approval, like every
   change in the target), then the **smoke step** invokes every routed model
   (``python -m model_build smoke``). A failure fails the stage; the pipeline stops there, and
   the next stage never deploys what failed.

The plan and smoke steps run the gate's code as this definition records it (a zip of the
project's code, an asset of this stack, its SHA-256 in their buildspecs:
``stacks/pipeline_gate_code.py``), never the code of the commit they judge.

The pipeline mutates itself (CDK Pipelines' ``UpdatePipeline`` stage, with the CDK CLI and
cdk-assets pinned: :data:`CDK_CLI_VERSION`, :data:`CDK_ASSETS_VERSION`) and deploys across
accounts through the CDK bootstrap's trust (``cdk bootstrap --trust <pipeline account>``).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from aws_cdk import Aws, Duration, RemovalPolicy, Stack, Stage, pipelines
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_codecommit as codecommit
from aws_cdk import aws_codepipeline as codepipeline
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns

from constructs import Construct
from triton_mme_cdk.constructs.nag_acknowledgments import skip_checkov
from triton_mme_cdk.stacks.pipeline_access import (
    PipelineAccessStack,
    access_role_name,
    access_stack_name,
    step_role_name,
)
from triton_mme_cdk.stacks.pipeline_acknowledgments import (
    acknowledge_pipeline_compliance,
    acknowledge_pipeline_grants,
)
from triton_mme_cdk.stacks.pipeline_gate_code import GateCode
from triton_mme_cdk.stacks.pipeline_hold import APPROVE_STAGE, add_self_mutation_hold, hold_condition
from triton_mme_cdk.stacks.pipeline_settings import PipelineSettings, PipelineStage
from triton_mme_cdk.stacks.settings import MmeSettings

PLAN_VERDICT, PLAN_APPROVAL = "PLAN_VERDICT", "PLAN_APPROVAL"
ROOT = Path(__file__).resolve().parents[1]
#: The CDK CLI that ``SelfMutate`` installs (``npm install -g aws-cdk@<version>``): the one this
#: repository's package-lock.json locks, which ``make setup`` installs and the synth runs.
CDK_CLI_VERSION = str(json.loads((ROOT / "package-lock.json").read_text(encoding="utf-8"))
                      ["packages"]["node_modules/aws-cdk"]["version"])
#: The cdk-assets the asset projects install (``npm install -g cdk-assets@<version>``): not a
#: dependency of this repository, so pinned here (the release of 2026-09-18, which reads the cloud
#: assembly schema the pinned aws-cdk-lib writes). A change of either is a change of the pipeline's
#: definition, which the self-mutation hold shows a person.
CDK_ASSETS_VERSION = "4.7.3"
BUILD_IMAGE = codebuild.LinuxBuildImage.STANDARD_7_0
SETUP = "make plan-setup"


def shell_context(settings: dict[str, Any]) -> str:
    """``-c mme:key=value`` flags for a stage's settings, quoted for a shell."""
    return " ".join(f"-c {shlex.quote(f'mme:{k}={v if isinstance(v, str) else json.dumps(v)}')}"
                    for k, v in sorted(settings.items()))


class EndpointStage(Stage):
    """One target's endpoint stack, with the app's settings and the stage's overrides, and the
    read-only roles of the pipeline's steps: both deployed after the stage's plan and approval."""

    def __init__(self, scope: Construct, id: str, *, build: Any, settings: MmeSettings, stage: PipelineStage,
                 stack_name: str, pipeline_account: str, base: str) -> None:
        super().__init__(scope, id, env={"account": stage.account, "region": stage.region})
        self.stack = build(self, settings, stack_name)
        self.access = PipelineAccessStack(self, "Access", stack_name=access_stack_name(stack_name),
                                          endpoint_stack_name=stack_name, pipeline_account=pipeline_account,
                                          base=base, stage=stage.name, settings=settings)


class TritonMmePipelineStack(Stack):
    """The pipeline: source, synth, then per target: access, plan, approval when needed, deploy and smoke."""

    def __init__(self, scope: Construct, id: str, *, pipeline: PipelineSettings, settings: MmeSettings,
                 stage_settings: dict[str, MmeSettings], build_endpoint: Any, **kwargs: Any) -> None:
        super().__init__(scope, id, env={"account": pipeline.account, "region": pipeline.region}, **kwargs)
        self.settings = pipeline
        source = self._source(pipeline)
        self._source_files = source
        #: The artifact store: KMS-encrypted with a rotated key the targets' deploy roles may use,
        #: TLS only, its server access logs kept (CDK Pipelines' default bucket logs nothing).
        self.artifacts_key = kms.Key(self, "ArtifactsKey", enable_key_rotation=True,
                                     description="Encrypts the Triton pipeline's artifacts (cloud assembly, plans)")
        access_logs = self._bucket("ArtifactsAccessLogs", encryption=s3.BucketEncryption.S3_MANAGED,
                                   lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(365))])
        # cdk-nag's AwsSolutions-S1 passes a bucket that is another bucket's log destination; checkov does not.
        skip_checkov(access_logs, ["CKV_AWS_18"], "This bucket is the destination of the artifact bucket's "
                     "server access logs; logging its own accesses would need a third bucket and recurse.")
        self.artifacts = self._bucket("Artifacts", encryption=s3.BucketEncryption.KMS, encryption_key=self.artifacts_key,
                                      server_access_logs_bucket=access_logs, server_access_logs_prefix="artifacts/",
                                      lifecycle_rules=[s3.LifecycleRule(noncurrent_version_expiration=Duration.days(30))])
        self.code_pipeline = pipelines.CodePipeline(
            self, "Pipeline",
            pipeline_type=codepipeline.PipelineType.V2,
            artifact_bucket=self.artifacts,
            self_mutation=True,
            cli_version=CDK_CLI_VERSION,
            cdk_assets_cli_version=CDK_ASSETS_VERSION,
            docker_enabled_for_synth=False,
            synth=pipelines.ShellStep("Synth", input=source, commands=[SETUP, "node_modules/.bin/cdk synth --quiet"],
                                      primary_output_directory="cdk.out"),
            code_build_defaults=pipelines.CodeBuildOptions(build_environment=codebuild.BuildEnvironment(
                build_image=BUILD_IMAGE)),
        )
        base = settings.stack_name
        self.settings_base = base
        #: The roles the plan and smoke steps run with in this account: they may only assume
        #: the read-only roles of the targets.
        self.plan_role = self._step_role("PlanRole", base, "plan", pipeline)
        self.smoke_role = self._step_role("SmokeRole", base, "smoke", pipeline)
        #: The gate's code the plan and smoke steps run (``stacks/pipeline_gate_code.py``).
        self.gate = GateCode(self, "GateCode", root=ROOT)
        for role in (self.plan_role, self.smoke_role):
            self.gate.grant_read(role)
        topic = (sns.Topic.from_topic_arn(self, "ApprovalTopic", pipeline.approval_topic_arn)
                 if pipeline.approval_topic_arn else None)
        self.plan_steps: dict[str, pipelines.CodeBuildStep] = {}
        for stage in pipeline.stages:
            stack_name = f"{base}-{stage.name}"
            plan = self._plan_step(stage, stack_name, base)
            self.plan_steps[stage.name] = plan
            self.code_pipeline.add_wave(f"{stage.name}-plan", pre=[plan])
            self.code_pipeline.add_wave(f"{stage.name}-approve", pre=[pipelines.ManualApprovalStep(
                f"Approve-{stage.name}", comment=f"{stack_name}: see the plan", notification_topic=topic)])
            endpoint = EndpointStage(self, stage.name, build=build_endpoint, settings=stage_settings[stage.name],
                                     stage=stage, stack_name=stack_name, pipeline_account=pipeline.account, base=base)
            self.code_pipeline.add_stage(endpoint, post=[self._smoke_step(stage, stack_name, base, endpoint)])
        self.code_pipeline.build_pipeline()
        add_self_mutation_hold(self, self.code_pipeline.pipeline, key=self.artifacts_key, topic=topic)
        self._approval_conditions()
        acknowledge_pipeline_grants(self)
        acknowledge_pipeline_compliance(self, self.artifacts, access_logs)
        confine_codebuild_trust(self)

    # -----------------------------------------------------------------------------------------
    # Source, artifacts, roles, steps
    # -----------------------------------------------------------------------------------------

    def _bucket(self, id: str, **options: Any) -> s3.Bucket:
        """A private, versioned, TLS-only bucket (deleted with the stack only when empty)."""
        return s3.Bucket(self, id, block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                         object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED, enforce_ssl=True,
                         minimum_tls_version=1.2, versioned=True, removal_policy=RemovalPolicy.RETAIN, **options)

    def _source(self, pipeline: PipelineSettings) -> pipelines.CodePipelineSource:
        source = pipeline.source
        if source.kind == "codestar":
            assert source.connection_arn is not None
            return pipelines.CodePipelineSource.connection(source.repository, source.branch,
                                                           connection_arn=source.connection_arn)
        repository = codecommit.Repository.from_repository_name(self, "Repository", source.repository)
        return pipelines.CodePipelineSource.code_commit(repository, source.branch)

    def _step_role(self, id: str, base: str, kind: str, pipeline: PipelineSettings) -> iam.Role:
        """``<stack>-pipeline-<kind>``: a fixed name, which the targets' read-only roles trust."""
        role = iam.Role(self, id, role_name=step_role_name(base, kind),
                        assumed_by=iam.ServicePrincipal("codebuild.amazonaws.com"),
                        description=f"The pipeline's {kind} step: assumes the targets' read-only {kind} roles only")
        role.add_to_policy(iam.PolicyStatement(actions=["sts:AssumeRole"], resources=[
            f"arn:{Aws.PARTITION}:iam::{stage.account}:role/{access_role_name(base, stage.name, kind)}"
            for stage in pipeline.stages]))
        return role

    def _assume(self, stage: PipelineStage, base: str, kind: str) -> list[str]:
        """Commands that switch the step to the target's read-only role. The plan step goes on
        when the role cannot be assumed (the access stack is deployed after the first approval):
        ``PLAN_NO_ACCESS`` then makes the plan ask a person."""
        role = f"arn:aws:iam::{stage.account}:role/{access_role_name(base, stage.name, kind)}"
        exports = [f'export {name}=$(echo "$creds" | python3 -c "import json,sys; print(json.load(sys.stdin)[\'{key}\'])")'
                   for name, key in (("AWS_ACCESS_KEY_ID", "AccessKeyId"), ("AWS_SECRET_ACCESS_KEY", "SecretAccessKey"),
                                     ("AWS_SESSION_TOKEN", "SessionToken"))]
        assume = (f"aws sts assume-role --role-arn {role} --role-session-name {kind}-{stage.name} "
                  "--query Credentials --output json")
        if kind == "plan":  # one command: the step's own credentials are never used to read the target
            return [f"if creds=$({assume}); then {'; '.join(exports)}; else export PLAN_NO_ACCESS={role}; fi",
                    f"export AWS_REGION={stage.region} AWS_DEFAULT_REGION={stage.region}"]
        return [
            f"creds=$({assume})",
            *exports,
            f"export AWS_REGION={stage.region} AWS_DEFAULT_REGION={stage.region}",
        ]

    def _plan_step(self, stage: PipelineStage, stack_name: str, base: str) -> pipelines.CodeBuildStep:
        context = shell_context({**stage.settings, "stack_name": stack_name})
        return pipelines.CodeBuildStep(
            f"Plan-{stage.name}",
            input=self._source_files,
            additional_inputs={"cdk.out": self.code_pipeline.cloud_assembly_file_set},
            commands=[*self.gate.setup_commands(), *self._assume(stage, base, "plan"),
                      f"{GateCode.python('model_build.tools.review.pipeline_plan')} {shlex.quote(stack_name)} {context}"
                      f" --access-stack {shlex.quote(access_stack_name(stack_name))}"
                      + (" --require-approval always" if stage.require_approval == "always" else ""),
                      "set -a; . plan/verdict.env; set +a"],
            role=self.plan_role,
            primary_output_directory="plan",
            env={"STAGE": stage.name},
            partial_build_spec=codebuild.BuildSpec.from_object({"env": {"exported-variables": [
                PLAN_VERDICT, PLAN_APPROVAL, "PLAN_BUILD_URL"]}}),
            timeout=Duration.minutes(30),
        )

    def _smoke_step(self, stage: PipelineStage, stack_name: str, base: str, endpoint: EndpointStage) -> pipelines.CodeBuildStep:
        return pipelines.CodeBuildStep(
            f"Smoke-{stage.name}",
            commands=[*self.gate.setup_commands(), *self._assume(stage, base, "smoke"),
                      f'{GateCode.python("model_build")} smoke --endpoint "$ENDPOINT_NAME" --region "$AWS_REGION"'],
            input=self._source_files,
            env_from_cfn_outputs={"ENDPOINT_NAME": endpoint.stack.node.find_child("EndpointName")},
            role=self.smoke_role,
            timeout=Duration.minutes(60),
        )

    def _approval_conditions(self) -> None:
        """Wire each approval to its plan through CodePipeline variables, set on the synthesized
        pipeline (CDK Pipelines creates the stages, not these properties): the plan action's
        namespace ``plan-<name>``; the approval's text and link from its variables; and the
        approval stage's V2 condition: entered only when ``PLAN_APPROVAL`` is ``true``
        (``beforeEntry``, a ``VariableCheck`` rule, result ``SKIP``)."""
        cfn = self.code_pipeline.pipeline.node.default_child
        assert isinstance(cfn, codepipeline.CfnPipeline)
        stages = list(self.code_pipeline.pipeline.stages)
        names = [stage.stage_name for stage in stages]
        cfn.add_property_override(f"Stages.{names.index(APPROVE_STAGE)}.BeforeEntry", hold_condition())
        for stage in self.settings.stages:
            namespace = plan_namespace(stage.name)
            plan_index = names.index(f"{stage.name}-plan")
            (plan_action,) = [i for i, a in enumerate(stages[plan_index].actions)
                              if a.action_properties.action_name == f"Plan-{stage.name}"]
            cfn.add_property_override(f"Stages.{plan_index}.Actions.{plan_action}.Namespace", namespace)
            index = names.index(f"{stage.name}-approve")
            cfn.add_property_override(f"Stages.{index}.Actions.0.Configuration.CustomData", (
                f"{self.settings_base}-{stage.name}: plan verdict #{{{namespace}.{PLAN_VERDICT}}}. The plan's markdown "
                "is in the linked build's log and in plan/plan.md of its output. Approve to deploy."))
            cfn.add_property_override(f"Stages.{index}.Actions.0.Configuration.ExternalEntityLink",
                                      f"#{{{namespace}.PLAN_BUILD_URL}}")
            cfn.add_property_override(f"Stages.{index}.BeforeEntry", {"Conditions": [{
                "Result": "SKIP",
                "Rules": [{
                    "Name": f"PlanNeedsApproval-{stage.name}",
                    "RuleTypeId": {"Category": "Rule", "Owner": "AWS", "Provider": "VariableCheck", "Version": "1"},
                    "Configuration": {"Variable": f"#{{{namespace}.{PLAN_APPROVAL}}}", "Value": "true",
                                      "Operator": "EQ"},
                }],
            }]})


#: The principal of every CodeBuild project's role in the pipeline (CDK Pipelines' own and ours).
CODEBUILD = "codebuild.amazonaws.com"


def confine_codebuild_trust(stack: Stack) -> int:
    """Make every role that trusts CodeBuild in ``stack`` trust it only for this account's
    projects: ``aws:SourceAccount`` equal to the stack's account and ``aws:SourceArn`` like
    ``arn:<partition>:codebuild:<region>:<account>:project/*``. Returns how many statements it
    conditioned.

    CDK Pipelines creates the synth, self-mutation and asset roles without a condition, and offers
    no option for one; so the synthesized trust statements are amended (a property override on
    each ``AWS::IAM::Role``), after the pipeline is built. A project's own ARN cannot be named: the
    project refers to its role, so the role naming the project would be a cycle. CodeBuild sets
    ``aws:SourceArn`` to the project's ARN when it assumes a project's service role: AWS's own
    deployment framework (awslabs/aws-deployment-framework, ``adf-bootstrap/deployment/global.yml``)
    conditions its CodeBuild roles on ``aws:SourceArn`` like ``...:codebuild:<region>:<account>:project/*``,
    and its pull request #247 quotes the key in CodeBuild's ``AssumeRole`` context. A statement
    that already has a condition is left as it is."""
    conditions = {
        "StringEquals": {"aws:SourceAccount": stack.account},
        "ArnLike": {"aws:SourceArn": stack.format_arn(service="codebuild", resource="project", resource_name="*")},
    }
    conditioned = 0
    for node in stack.node.find_all():
        if not isinstance(node, iam.CfnRole) or Stack.of(node) is not stack:
            continue
        document = stack.resolve(node.assume_role_policy_document)
        for index, statement in enumerate(document.get("Statement", [])):
            if statement.get("Principal") == {"Service": CODEBUILD} and "Condition" not in statement:
                node.add_property_override(f"AssumeRolePolicyDocument.Statement.{index}.Condition", conditions)
                conditioned += 1
    return conditioned


def plan_namespace(stage: str) -> str:
    """The CodePipeline variable namespace of a stage's plan action."""
    return f"plan-{stage}"
