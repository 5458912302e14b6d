"""The self-mutation hold: a change to the pipeline's own definition waits for a person.

CDK Pipelines' ``UpdatePipeline`` stage deploys the pipeline stack as the branch synthesized it,
so one commit could remove the approvals or weaken the plan step. CDK Pipelines offers no step
before ``SelfMutate`` (its ``UpdatePipeline`` stage is built by ``CodePipeline`` itself, not a
wave), so after the pipeline is built two stages are inserted in the CodePipeline L2 pipeline,
right before ``UpdatePipeline`` (``Pipeline.addStage`` with ``placement.rightBefore``):

1. ``PipelineChange``: a CodeBuild action on the cloud assembly only (no source: nothing of the
   commit runs). Its commands are the deployed pipeline's own buildspec: ``aws cloudformation
   get-template`` of the pipeline stack as deployed, and :data:`CHECK` (Python's standard library,
   run with ``python3 -c``; ``stacks/pipeline_hold_check.py``). It resolves the template the way
   ``SelfMutate``'s ``cdk -a . deploy <stack>`` does, through the assembly's ``manifest.json``, and
   compares it with the deployed one: every resource but the asset publishing, which changes with
   every model or code change and is compared instead with the shape of the deployed pipeline's
   own asset projects (their roles, environment and buildspec as CDK Pipelines generated them;
   only the publishing lines' paths and selectors may differ). It exports
   ``PIPELINE_CHANGE_APPROVAL`` (``true`` when anything differs, when what ``SelfMutate`` would
   deploy is not that one template, or when the deployed template cannot be read) and
   ``PIPELINE_CHANGE`` (what differs).
2. ``PipelineChange-approve``: a manual approval, entered only when ``PIPELINE_CHANGE_APPROVAL``
   is ``true`` (a V2 ``beforeEntry`` condition, ``VariableCheck``, result ``SKIP``).

Both stages belong to the pipeline already deployed: the commit under review cannot change them
before they run, since ``SelfMutate`` comes after.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from aws_cdk import Aws, Stack
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_codepipeline as codepipeline
from aws_cdk import aws_codepipeline_actions as actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns

from constructs import Construct

NAMESPACE = "pipeline-change"
APPROVAL, CHANGE = "PIPELINE_CHANGE_APPROVAL", "PIPELINE_CHANGE"
CHECK_STAGE, APPROVE_STAGE = "PipelineChange", "PipelineChange-approve"

#: The comparison (python3, standard library only; ``stacks/pipeline_hold_check.py``, its docstring
#: left out): ``CHECK STACK ASSEMBLY DEPLOYED_TEMPLATE`` prints ``PIPELINE_CHANGE_APPROVAL=...`` and
#: ``PIPELINE_CHANGE=...`` lines for ``. file``.
_SOURCE = (Path(__file__).resolve().parent / "pipeline_hold_check.py").read_text(encoding="utf-8")
CHECK = _SOURCE[_SOURCE.index("from __future__"):]


def deploys_to(stack: Stack) -> dict[str, Any]:
    """Where the stack deploys, as its synthesizer writes it in the cloud assembly's manifest: its
    name, environment and the bootstrap roles the CLI assumes and passes (None where it names none)."""
    synthesizer = stack.synthesizer
    return {"stackName": stack.stack_name, "environment": f"aws://{stack.account}/{stack.region}",
            "assumeRoleArn": getattr(synthesizer, "deploy_role_arn", None),
            "cloudFormationExecutionRoleArn": getattr(synthesizer, "cloud_formation_execution_role_arn", None)}


def check_commands(stack_name: str, stack_id: str, where: dict[str, Any]) -> list[str]:
    """The check's commands: read the deployed template (an empty file when it cannot be read:
    the check then asks a person), compare it with the template ``cdk deploy stack_id`` (what
    ``SelfMutate`` runs) resolves in the cloud assembly (the build's folder), deploying to
    ``where`` (:func:`deploys_to`; its ``$`` written ``\\u0024``, the same JSON: a buildspec may not
    hold ``${AWS::Partition}`` outside an ``Fn::Sub``), export."""
    return [
        f"aws cloudformation get-template --stack-name {shlex.quote(stack_name)} --template-stage Original "
        "--query TemplateBody --output json > /tmp/deployed.json || : > /tmp/deployed.json",
        f"python3 -c {shlex.quote(CHECK)} {shlex.quote(stack_id)} . /tmp/deployed.json "
        f"{shlex.quote(json.dumps(where, sort_keys=True).replace('$', chr(92) + 'u0024'))} > /tmp/change.env",
        "cat /tmp/change.env",
        "set -a; . /tmp/change.env; set +a",
    ]


def add_self_mutation_hold(scope: Construct, pipeline: codepipeline.Pipeline, *, key: kms.IKey,
                           topic: sns.ITopic | None) -> None:
    """Insert the check and its approval right before ``UpdatePipeline``; see the module's text."""
    stack = Stack.of(scope)
    stages = list(pipeline.stages)
    (update,) = [s for s in stages if s.stage_name == "UpdatePipeline"]
    inputs = update.actions[0].action_properties.inputs
    assert inputs, "CDK Pipelines' SelfMutate action has the cloud assembly as its input"
    assembly = inputs[0]  # the cloud assembly SelfMutate deploys
    project = codebuild.PipelineProject(
        scope, "PipelineChangeCheck",
        description="Compares the pipeline's new definition with the deployed one before it updates itself",
        environment=codebuild.BuildEnvironment(build_image=codebuild.LinuxBuildImage.STANDARD_7_0),
        encryption_key=key,
        build_spec=codebuild.BuildSpec.from_object({
            "version": "0.2",
            "env": {"exported-variables": [APPROVAL, CHANGE]},
            "phases": {"build": {"commands": check_commands(stack.stack_name, stack.node.path, deploys_to(stack))}},
        }),
    )
    project.add_to_role_policy(iam.PolicyStatement(
        actions=["cloudformation:GetTemplate"],
        resources=[f"arn:{Aws.PARTITION}:cloudformation:{Aws.REGION}:{Aws.ACCOUNT_ID}:stack/{stack.stack_name}/*"]))
    pipeline.add_stage(stage_name=CHECK_STAGE, placement=codepipeline.StagePlacement(right_before=update), actions=[
        actions.CodeBuildAction(action_name="CheckPipelineChange", project=project, input=assembly,
                                variables_namespace=NAMESPACE)])
    pipeline.add_stage(stage_name=APPROVE_STAGE, placement=codepipeline.StagePlacement(right_before=update), actions=[
        actions.ManualApprovalAction(
            action_name="ApprovePipelineChange", notification_topic=topic,
            additional_information=(f"#{{{NAMESPACE}.{CHANGE}}}. Approve to let the pipeline update itself "
                                    "(UpdatePipeline) with this definition; reject to keep the deployed one."))])


def hold_condition() -> dict[str, Any]:
    """The approval stage's entry condition: entered only when the check asks."""
    return {"Conditions": [{"Result": "SKIP", "Rules": [{
        "Name": "PipelineChangeNeedsApproval",
        "RuleTypeId": {"Category": "Rule", "Owner": "AWS", "Provider": "VariableCheck", "Version": "1"},
        "Configuration": {"Variable": f"#{{{NAMESPACE}.{APPROVAL}}}", "Value": "true", "Operator": "EQ"},
    }]}]}
