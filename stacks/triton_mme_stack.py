"""The app's stack: one :class:`~triton_mme_cdk.constructs.multi_model_endpoint.TritonMultiModelEndpoint`
from the app's settings, the cost-allocation tags and the stack's outputs. It reads no settings from
the context itself (only CDK's lookup cache, through ``ec2.Vpc.from_lookup``, for an existing VPC).

The endpoint construct has the id ``Default``, which the CDK leaves out of logical ids: every
resource keeps the logical id it had when this stack built the same resources itself, so an
upgrade replaces nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aws_cdk import CfnOutput, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_sns as sns

from constructs import Construct
from triton_mme_cdk.constructs.cost_tags import apply_cost_tags
from triton_mme_cdk.constructs.multi_model_endpoint import ModelSource, TritonMultiModelEndpoint
from triton_mme_cdk.constructs.sagemaker_limits import PropsError
from triton_mme_cdk.model_build.manifest import Manifest
from triton_mme_cdk.stacks.context_table import (
    CONTEXT_KEYS,
    CONTEXT_PREFIX,
    ENDPOINT_KEYS,
    construct_keywords,
)
from triton_mme_cdk.stacks.settings import MmeSettings

#: The id of the endpoint construct (left out of logical ids by the CDK).
ENDPOINT_ID = "Default"


class TritonMmeStack(Stack):
    """NVIDIA Triton models on a SageMaker multi-model GPU endpoint, with the build that publishes
    them: the app's settings (``mme:`` context) as one
    :class:`~triton_mme_cdk.constructs.multi_model_endpoint.TritonMultiModelEndpoint`, with an
    existing VPC (``mme:vpc_id``, looked up) and an existing topic (``mme:alarm_topic_arn``) as
    resources, the cost-allocation tags (Project, Environment, Owner) on every taggable resource,
    and the stack's outputs.

    :param settings: the validated settings.
    :param manifest: the models manifest, or None to serve ``settings.release_id``.
    :param manifest_path: the manifest's file (required with ``manifest``).
    :param build_context: Docker build context of the build image. Default: ``model_build/``.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        settings: MmeSettings,
        manifest: Manifest | None,
        manifest_path: Path | None,
        build_context: Path | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(scope, id, **kwargs)
        #: The settings, the manifest and its file the stack was built from (for the synth's plan line).
        self.settings = settings
        self.manifest = manifest
        self.manifest_path = manifest_path
        if manifest is not None:
            if manifest_path is None:
                raise PropsError("manifest_path: missing; the manifest file is uploaded as an asset")
            models = ModelSource(manifest=manifest, manifest_path=manifest_path, release_id=None)
        elif settings.release_id is None:
            raise PropsError("release_id: missing without a manifest; give the release to serve")
        else:
            models = ModelSource.from_release(settings.release_id)
        vpc = ec2.Vpc.from_lookup(self, "ExistingVpc", vpc_id=settings.vpc_id) if settings.vpc_id is not None else None
        topic = (sns.Topic.from_topic_arn(self, "ExistingAlarmTopic", settings.alarm_topic_arn)
                 if settings.alarm_topic_arn is not None else None)
        # The context's numbers and strings as the construct's keywords (Duration, Size, roles).
        given = construct_keywords(self, ((key, getattr(settings, key)) for key in ENDPOINT_KEYS
                                          if key in settings.model_fields_set))
        try:
            #: The endpoint and everything it is made of.
            self.endpoint_construct = mme = TritonMultiModelEndpoint(
                self, ENDPOINT_ID, models=models, vpc=vpc, alarm_topic=topic, build_context=build_context, **given)
        except PropsError as error:
            # The construct names a setting by its keyword; the app's user gave it as mme:<key>.
            name, _, rest = str(error).partition(":")
            if name in CONTEXT_KEYS:
                raise PropsError(f"{CONTEXT_PREFIX}{CONTEXT_KEYS[name]}:{rest}") from None
            raise
        #: Its parts, for tests and extensions.
        self.model_bucket = mme.model_bucket
        self.network = mme.network
        self.triton_image = mme.triton_image
        self.execution_role = mme.execution_role
        self.endpoint = mme.endpoint
        self.alarms = mme.alarms
        self.alarm_topic = mme.alarm_topic
        self.dashboard = mme.dashboard
        self.rollout = mme.rollout
        self.model_data_url = mme.model_data_url
        self.routes_url = mme.routes_url
        apply_cost_tags(
            self, {"Project": settings.tag_project, "Environment": settings.tag_environment, "Owner": settings.tag_owner}
        )
        self._outputs(mme)

    def _outputs(self, mme: TritonMultiModelEndpoint) -> None:
        outputs: list[tuple[str, str, str]] = [
            ("EndpointName", mme.endpoint_name, "SageMaker endpoint to invoke, with TargetModel=<model>.tar.gz"),
            ("EndpointArn", mme.endpoint_arn, "ARN of the endpoint"),
            ("ModelBucketName", mme.model_bucket.bucket_name,
             "S3 bucket of the model artifacts (KMS-encrypted, versioned)"),
            ("ModelDataUrl", mme.model_data_url,
             "S3 prefix the endpoint serves (the model's ModelDataUrl; fixed for the life of the stack)"),
            ("RoutesUrl", mme.routes_url,
             "Routes document: each logical model name to its current TargetModel, with the release id"),
            ("ReleaseId", mme.release_id, "Release routed by this deploy (derived from the manifest and build code)"),
            ("ExecutionRoleArn", mme.execution_role.role_arn,
             "Role SageMaker assumes to host the endpoint (reads the model prefix only)"),
            ("DashboardName", mme.dashboard.dashboard_name,
             "CloudWatch dashboard of the endpoint (requests, latency, instances, models, GPU)"),
            ("DashboardUrl", mme.dashboard_url, "Console link to the endpoint's CloudWatch dashboard"),
        ]
        if mme.alarm_topic is not None:
            outputs.append(("AlarmTopicArn", mme.alarm_topic.topic_arn,
                            "SNS topic the endpoint's alarms notify (KMS-encrypted, TLS only); subscribe to it"))
        if mme.network is not None:
            outputs.append(("VpcId", mme.network.vpc.vpc_id, "VPC of the endpoint's model"))
            if mme.network.model_security_group is not None:
                outputs.append(("ModelSecurityGroupId", mme.network.model_security_group.security_group_id,
                                "Security group of the model's network interfaces (no inbound rule)"))
        for output_id, value, description in outputs:
            CfnOutput(self, output_id, value=value, description=description)
