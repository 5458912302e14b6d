#!/usr/bin/env python3
"""A platform team's own CDK app with a Triton multi-model endpoint from ``pip install triton-mme-cdk``.

The team brings its VPC, its bucket and KMS key, and its alarm topic; a Lambda function of its own
calls a model by its logical name through the client (``client_function/index.py``): the layer
brings the client and numpy, ``connect_client`` its environment and its grant. Run it as any CDK
app: ``cdk synth`` (or ``python app.py``) in this folder, after the layer's numpy wheel is in
``.wheelhouse`` (``make setup`` in a checkout; elsewhere the ``pip download`` of
``TritonMmeClientLayer``'s docs).
"""

from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from cdk_nag import AwsSolutionsChecks

from constructs import Construct
from triton_mme_cdk import ModelSource, TritonMmeClientLayer, TritonMultiModelEndpoint

HERE = Path(__file__).resolve().parent

#: The function's code: event {"model": "<logical name>", "inputs": {...}} (client_function/index.py).
CLIENT_CODE = HERE / "client_function"
CLIENT_RUNTIME = lambda_.Runtime.PYTHON_3_14


class PlatformStack(cdk.Stack):
    def __init__(self, scope: Construct, id: str, **kwargs: object) -> None:
        super().__init__(scope, id, **kwargs)  # type: ignore[arg-type]
        # What the platform team already has: a key, a VPC without internet access, a bucket, a topic.
        key = kms.Key(self, "PlatformKey", enable_key_rotation=True)
        vpc = ec2.Vpc(self, "Vpc", max_azs=2, nat_gateways=0, subnet_configuration=[
            ec2.SubnetConfiguration(name="isolated", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)])
        vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)
        vpc.add_flow_log("FlowLogs")
        access_logs = s3.Bucket(self, "AccessLogs", enforce_ssl=True, versioned=True,
                                block_public_access=s3.BlockPublicAccess.BLOCK_ALL)
        bucket = s3.Bucket(self, "Models", encryption=s3.BucketEncryption.KMS, encryption_key=key,
                           enforce_ssl=True, versioned=True, block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                           server_access_logs_bucket=access_logs, server_access_logs_prefix="models/")
        topic = sns.Topic(self, "Alarms", master_key=key, enforce_ssl=True)
        key.grant_encrypt_decrypt(iam.ServicePrincipal("cloudwatch.amazonaws.com"))  # alarms publish to the topic

        endpoint = TritonMultiModelEndpoint(
            self, "Embeddings",
            models=ModelSource.from_manifest(HERE / "models.yaml"),
            bucket=bucket, vpc=vpc, alarm_topic=topic,
            endpoint_name="platform-embeddings", model_prefix="embeddings",
            instance_type="ml.g5.xlarge", min_instance_count=1, max_instance_count=2,
        )

        # The team's client: a role of its own (writes its own log group only); the layer brings the
        # client and numpy, connect_client its environment and the grant (invoke, the routes, the key).
        client_role = iam.Role(self, "ClientRole", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
        client_logs = logs.LogGroup(self, "ClientLogs", retention=logs.RetentionDays.ONE_MONTH)
        layer = TritonMmeClientLayer(self, "ClientLayer", runtime=CLIENT_RUNTIME)
        client = lambda_.Function(
            self, "Client", runtime=CLIENT_RUNTIME, handler="index.handler", role=client_role,
            code=lambda_.Code.from_asset(str(CLIENT_CODE), exclude=["__pycache__", "*.pyc"]), layers=[layer], log_group=client_logs,
            timeout=cdk.Duration.seconds(60))  # a cold model loads in seconds; the client retries 507s
        client_logs.grant_write(client_role)
        endpoint.connect_client(client)
        cdk.CfnOutput(self, "EndpointName", value=endpoint.endpoint_name)
        cdk.CfnOutput(self, "RoutesUrl", value=endpoint.routes_url)


def main() -> None:
    app = cdk.App()
    PlatformStack(app, "PlatformEmbeddings")
    # cdk-nag as the platform's own gate: a finding fails the synth (cdk.out/validation-report.json names it).
    # A regulated team adds HIPAASecurityChecks, NIST80053R5Checks or PCIDSS321Checks here: the endpoint's
    # resources pass them too (docs/security.md, "Compliance packs"); the team's own are its business.
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    app.synth()


if __name__ == "__main__":
    main()
