"""An encrypted, TLS-only SNS topic that CloudWatch alarms can publish to."""

from __future__ import annotations

import re
from typing import Annotated

from aws_cdk import ArnFormat, Aws, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns
from pydantic import AfterValidator, Field

from constructs import Construct
from triton_mme_cdk.constructs.customer_key import customer_key
from triton_mme_cdk.constructs.props import Props, is_unresolved

#: A plain e-mail address (what an SNS ``email`` subscription takes).
EMAIL_PATTERN = r"^[^@\s]+@[^@\s]+\.[^@\s]+$"
CLOUDWATCH_PRINCIPAL = "cloudwatch.amazonaws.com"


def _emails(emails: list[str]) -> list[str]:
    for email in emails:
        if not is_unresolved(email) and not re.fullmatch(EMAIL_PATTERN, email):
            raise ValueError(f"got {email!r}; expected e-mail addresses such as ops@example.com")
    if len(set(emails)) != len(emails):
        raise ValueError(f"got {emails!r}; an address is given twice")
    return emails


class AlarmTopicProps(Props):
    """Props of :class:`AlarmTopic`."""

    emails: Annotated[list[str], AfterValidator(_emails)] = Field(
        default_factory=list,
        description="E-mail addresses subscribed to the alarm topic (each confirms by mail). Empty: none.",
    )
    removal_policy: RemovalPolicy = Field(
        default=RemovalPolicy.RETAIN,
        description="Of the topic's key: RETAIN keeps it when the stack is deleted; DESTROY deletes it "
        "(after its 7-day deletion window).",
    )


class AlarmTopic(Construct):
    """An SNS topic for alarm notifications.

    - Encrypted with its own customer-managed KMS key (rotation on). CloudWatch cannot publish to
      a topic encrypted with the AWS-managed ``alias/aws/sns`` key; the key policy lets
      ``cloudwatch.amazonaws.com`` use this key (``kms:Decrypt``, ``kms:GenerateDataKey*``) for
      this account only.
    - The topic policy denies any publish without TLS (``aws:SecureTransport``) and lets
      CloudWatch alarms of this account and region publish: a topic policy replaces SNS's default
      one, and without that statement CloudWatch's publish is refused.
    - Each address of ``emails`` gets an ``email`` subscription (to be confirmed by its owner).
    """

    def __init__(self, scope: Construct, id: str, *, props: AlarmTopicProps | None = None) -> None:
        super().__init__(scope, id)
        props = props or AlarmTopicProps()
        self.key = customer_key(
            self,
            "Key",
            description="Encrypts the alarm notifications of the Triton multi-model endpoint",
            removal_policy=props.removal_policy,
        )
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchAlarmsToPublish",
                principals=[iam.ServicePrincipal(CLOUDWATCH_PRINCIPAL)],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],
                conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}},
            )
        )
        self.topic = sns.Topic(
            self, "Resource", display_name="Triton multi-model endpoint alarms", master_key=self.key, enforce_ssl=True
        )
        self._allow_cloudwatch()
        for index, email in enumerate(props.emails):
            sns.Subscription(
                self, f"Email{index}", topic=self.topic, protocol=sns.SubscriptionProtocol.EMAIL, endpoint=email
            )
        #: ARN of the topic.
        self.topic_arn: str = self.topic.topic_arn

    def _allow_cloudwatch(self) -> None:
        alarm_arns = Stack.of(self).format_arn(
            service="cloudwatch", resource="alarm", resource_name="*", arn_format=ArnFormat.COLON_RESOURCE_NAME
        )
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchAlarmsToPublish",
                principals=[iam.ServicePrincipal(CLOUDWATCH_PRINCIPAL)],
                actions=["sns:Publish"],
                resources=[self.topic.topic_arn],
                conditions={
                    "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
                    "ArnLike": {"aws:SourceArn": alarm_arns},
                },
            )
        )
