"""Integ test: the construct with a team's own resources (a KMS key, a VPC without internet access,
a versioned bucket with access logs, an alarm topic), and a team's caller in another stack;
deployed, a model answers by its logical name.

Deploy it in your account with ``make integ-deploy INTEG=integ_bring_your_own.py`` (docs/testing.md,
"Integ tests").
"""

from __future__ import annotations

import aws_cdk as cdk
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_sns as sns
from aws_cdk.integ_tests_alpha import IntegTest
from callers import ROOT, CallerStack, expect_answer

from triton_mme_cdk import ModelSource, TritonMultiModelEndpoint

app = cdk.App()
stack = cdk.Stack(app, "BringYourOwn")
key = kms.Key(stack, "TeamKey", enable_key_rotation=True, removal_policy=cdk.RemovalPolicy.DESTROY)
vpc = ec2.Vpc(stack, "Vpc", max_azs=2, nat_gateways=0, subnet_configuration=[
    ec2.SubnetConfiguration(name="isolated", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)])
vpc.add_gateway_endpoint("S3", service=ec2.GatewayVpcEndpointAwsService.S3)
vpc.add_flow_log("FlowLogs")
access_logs = s3.Bucket(stack, "AccessLogs", enforce_ssl=True, versioned=True,
                        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                        removal_policy=cdk.RemovalPolicy.DESTROY, auto_delete_objects=True)
bucket = s3.Bucket(stack, "Models", encryption=s3.BucketEncryption.KMS, encryption_key=key, enforce_ssl=True,
                   versioned=True, block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
                   server_access_logs_bucket=access_logs, server_access_logs_prefix="models/",
                   removal_policy=cdk.RemovalPolicy.DESTROY, auto_delete_objects=True)
topic = sns.Topic(stack, "Alarms", master_key=key, enforce_ssl=True)
key.grant_encrypt_decrypt(iam.ServicePrincipal("cloudwatch.amazonaws.com"))  # alarms publish to the topic
endpoint = TritonMultiModelEndpoint(
    stack, "Embeddings", models=ModelSource.from_manifest(ROOT / "models.yaml"),
    bucket=bucket, vpc=vpc, alarm_topic=topic, endpoint_name="integ-bring-your-own", model_prefix="embeddings", artifacts_on_delete="destroy",
    instance_type="ml.g5.xlarge", min_instance_count=1, max_instance_count=1)
caller = CallerStack(app, "BringYourOwnCaller", endpoint=endpoint)
integ = IntegTest(app, "BringYourOwnResources", test_cases=[stack, caller])
expect_answer(integ, caller)
app.synth()
