"""An encrypted, TLS-only SNS topic that CloudWatch alarms can publish to."""

from __future__ import annotations

import re
from collections.abc import Sequence

from aws_cdk import ArnFormat, Aws, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns

from constructs import Construct
from constructs.sagemaker_limits import PropsError

#: A plain e-mail address (what an SNS ``email`` subscription takes).
EMAIL_PATTERN = r"^[^@\s]+@[^@\s]+\.[^@\s]+$"
CLOUDWATCH_PRINCIPAL = "cloudwatch.amazonaws.com"


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

    :param emails: addresses to subscribe. Default: none.
    :param removal_policy: of the topic's key. Default: ``RETAIN``.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        emails: Sequence[str] = (),
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, id)
        for email in emails:
            if not re.fullmatch(EMAIL_PATTERN, email):
                raise PropsError(f"emails: got {email!r}; expected an e-mail address such as ops@example.com")
        if len(set(emails)) != len(emails):
            raise PropsError("emails: an address is given twice")

        stack = Stack.of(self)
        alarm_arns = stack.format_arn(
            service="cloudwatch", resource="alarm", resource_name="*", arn_format=ArnFormat.COLON_RESOURCE_NAME
        )
        self.key = kms.Key(
            self,
            "Key",
            description="Encrypts the alarm notifications of the Triton multi-model endpoint",
            enable_key_rotation=True,
            removal_policy=removal_policy,
            pending_window=Duration.days(7) if removal_policy == RemovalPolicy.DESTROY else None,
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
            self,
            "Resource",
            display_name="Triton multi-model endpoint alarms",
            master_key=self.key,
            enforce_ssl=True,
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
        for index, email in enumerate(emails):
            sns.Subscription(
                self,
                f"Email{index}",
                topic=self.topic,
                protocol=sns.SubscriptionProtocol.EMAIL,
                endpoint=email,
            )
        #: ARN of the topic.
        self.topic_arn: str = self.topic.topic_arn
