"""What a client of a Triton multi-model endpoint uses, created here or imported from elsewhere.

:class:`ITritonMultiModelEndpoint` is the interface (in the CDK's style: ``IEndpoint`` with the
grants and metrics of ``EndpointBase``): the endpoint's name and ARN, the routes document
(``routes_bucket_name``, ``routes_key``, ``routes_url``), :meth:`~ITritonMultiModelEndpoint.grant_invoke`,
:meth:`~ITritonMultiModelEndpoint.connect_client` and the ``metric_*`` methods
(:class:`~triton_mme_cdk.constructs.endpoint_metrics.EndpointMetrics`). The created
``TritonMultiModelEndpoint`` implements it, and so does what
``TritonMultiModelEndpoint.from_endpoint_attributes`` returns
(:class:`ImportedTritonMultiModelEndpoint`): a client stack of the same app or of another app
grants itself invoke and builds its own alarms from the endpoint's name, bucket, key and model
prefix. An imported endpoint creates no resource.

What the client (``triton_mme_client``) reads is the routes document alone: the release's
signatures travel inside it, so reading it is all a client needs of the bucket.
"""

from __future__ import annotations

from typing import Self

from aws_cdk import Duration, Stack, Token
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3 as s3
from pydantic import Field, model_validator

from constructs import Construct
from triton_mme_cdk.constructs.endpoint_metrics import EndpointMetrics
from triton_mme_cdk.constructs.model_bucket import KeyPrefix, s3_via_service
from triton_mme_cdk.constructs.props import Props, Resource
from triton_mme_cdk.constructs.sagemaker_limits import PropsError, SageMakerName
from triton_mme_cdk.model_build.release import routes_key
from triton_mme_client.client import ENV_ENDPOINT_NAME, ENV_REFRESH_SECONDS, ENV_ROUTES_URL

#: The production variant the construct creates (``SageMakerHostingProps.variant_name``'s default).
DEFAULT_VARIANT_NAME = "AllTraffic"


def endpoint_arns(scope: Construct, endpoint_name: str) -> list[str]:
    """The ARNs a grant on the endpoint ``endpoint_name`` names, in the partition, region and
    account of ``scope``'s stack. SageMaker writes an endpoint's ARN with its name in lowercase
    (``describe_endpoint`` of ``MyEndpoint`` answers ``.../endpoint/myendpoint``); IAM compares ARNs
    case-sensitively, so a name with capitals is granted in both spellings. A name that is a token
    (known at deploy only) is used as given: pass it in lowercase."""
    stack = Stack.of(scope)

    def arn(name: str) -> str:
        return stack.format_arn(service="sagemaker", resource="endpoint", resource_name=name)

    if Token.is_unresolved(endpoint_name) or endpoint_name == endpoint_name.lower():
        return [arn(endpoint_name)]
    return [arn(endpoint_name.lower()), arn(endpoint_name)]


class ITritonMultiModelEndpoint(EndpointMetrics):
    """A Triton multi-model endpoint as its clients see it (created or imported).

    Each implementation sets ``routes_bucket_name``, ``routes_key`` and ``routes_url`` and has the
    properties ``endpoint_name``, ``endpoint_arn``, ``bucket`` and ``encryption_key``; the grants
    and the ``metric_*`` methods are defined here once."""

    #: The bucket that holds the routes document (the artifacts bucket).
    routes_bucket_name: str
    #: The routes document's key: ``<model_prefix>/_routes/routes.json``.
    routes_key: str
    #: ``s3://<bucket>/<model_prefix>/_routes/routes.json``: what ``TritonMmeClient`` takes as ``routes_url``.
    routes_url: str

    @property
    def endpoint_name(self) -> str:
        """The endpoint's name (``TritonMmeClient``'s ``endpoint_name``)."""
        raise NotImplementedError

    @property
    def endpoint_arn(self) -> str:
        """The endpoint's ARN."""
        raise NotImplementedError

    @property
    def bucket(self) -> s3.IBucket:
        """The artifacts bucket, which holds the routes document."""
        raise NotImplementedError

    @property
    def encryption_key(self) -> kms.IKey:
        """The KMS key that encrypts the artifacts (the routes document included)."""
        raise NotImplementedError

    def _invoke_arns(self) -> list[str]:
        """The ARNs :meth:`grant_invoke` names for ``sagemaker:InvokeEndpoint``."""
        return [self.endpoint_arn]

    def grant_invoke(self, grantee: iam.IGrantable) -> iam.Grant:
        """Let ``grantee`` call the endpoint's models by their logical names: what
        ``TritonMmeClient`` needs and nothing more.

        - ``sagemaker:InvokeEndpoint`` on the endpoint;
        - ``s3:GetObject`` on the routes document (it carries the release's signatures too);
        - ``kms:Decrypt`` on the bucket's key, only through S3 (``kms:ViaService`` =
          ``s3.<region>.<url suffix>`` of this stack's region, as every grant of the bucket's key).
        """
        invoke = iam.Grant.add_to_principal(grantee=grantee, actions=["sagemaker:InvokeEndpoint"],
                                            resource_arns=self._invoke_arns())
        routes = iam.Grant.add_to_principal(grantee=grantee, actions=["s3:GetObject"],
                                            resource_arns=[self.bucket.arn_for_objects(self.routes_key)])
        decrypt = iam.Grant.add_to_principal(
            grantee=grantee, actions=["kms:Decrypt"], resource_arns=[self.encryption_key.key_arn],
            conditions={"StringEquals": {"kms:ViaService": s3_via_service(self.bucket.stack)}})
        return invoke.combine(routes).combine(decrypt)

    def connect_client(self, function: lambda_.Function, *, refresh: Duration | None = None) -> iam.Grant:
        """Hand ``function`` what ``TritonMmeClient.from_env()`` reads: its environment
        (``TRITON_MME_ENDPOINT_NAME``, ``TRITON_MME_ROUTES_URL`` and, with ``refresh``,
        ``TRITON_MME_REFRESH_SECONDS``: how old the routes may get before they are read again;
        unset, the client's 30 s) and :meth:`grant_invoke`. The client and numpy reach the
        function through ``TritonMmeClientLayer`` (or its own package)."""
        if not isinstance(function, lambda_.Function):
            raise PropsError(f"function: got {type(function).__name__}; expected a lambda_.Function (its "
                             "environment is set); for another grantee use grant_invoke and set "
                             f"{ENV_ENDPOINT_NAME} and {ENV_ROUTES_URL} yourself")
        function.add_environment(ENV_ENDPOINT_NAME, self.endpoint_name)
        function.add_environment(ENV_ROUTES_URL, self.routes_url)
        if refresh is not None:
            seconds = refresh.to_seconds(integral=False)
            if Token.is_unresolved(seconds):
                raise PropsError("refresh: got a token; expected a Duration known at synth (the client reads "
                                 f"{ENV_REFRESH_SECONDS} as a number)")
            if seconds < 1:
                raise PropsError(f"refresh: got {seconds:g} s; expected at least 1 s (the routes are read at "
                                 "most once per refresh)")
            function.add_environment(ENV_REFRESH_SECONDS, f"{seconds:g}")
        return self.grant_invoke(function)


class EndpointAttributes(Props):
    """What ``TritonMultiModelEndpoint.from_endpoint_attributes`` takes."""

    endpoint_name: SageMakerName = Field(description="The endpoint's name (the construct's endpoint_name).")
    bucket: Resource[s3.IBucket] = Field(description="The artifacts bucket (s3.Bucket.from_bucket_name, ...).")
    model_prefix: KeyPrefix = Field(description="The endpoint's model_prefix in the bucket.")
    encryption_key: Resource[kms.IKey] | None = Field(
        default=None, description="The bucket's KMS key. Unset: the key the bucket carries.")
    variant_name: SageMakerName = Field(default=DEFAULT_VARIANT_NAME,
                                        description="The production variant the metrics name.")

    @model_validator(mode="after")
    def _key_known(self) -> Self:
        if self.encryption_key is None and self.bucket.encryption_key is None:
            raise ValueError(
                "encryption_key: missing, and the bucket carries no key; the routes document is encrypted "
                "with the bucket's KMS key and a client must decrypt it: pass it as encryption_key "
                "(kms.Key.from_key_arn(...)), or a bucket that carries it "
                "(s3.Bucket.from_bucket_attributes(..., encryption_key=key))")
        return self


class ImportedTritonMultiModelEndpoint(ITritonMultiModelEndpoint, Construct):
    """An endpoint deployed by another stack or app, from its attributes: no resource is created."""

    def __init__(self, scope: Construct, id: str, *, attributes: EndpointAttributes) -> None:
        super().__init__(scope, id)
        self._endpoint_name = attributes.endpoint_name
        self._bucket: s3.IBucket = attributes.bucket
        self._key: kms.IKey = attributes.encryption_key or attributes.bucket.encryption_key  # type: ignore[assignment]
        #: The endpoint's name as the ``metric_*`` dimensions name it.
        self.metric_endpoint_name = attributes.endpoint_name
        #: The production variant the ``metric_*`` dimensions name.
        self.variant_name = attributes.variant_name
        self.routes_bucket_name = attributes.bucket.bucket_name
        self.routes_key = routes_key(attributes.model_prefix)
        self.routes_url = f"s3://{self.routes_bucket_name}/{self.routes_key}"
        self._arns = endpoint_arns(self, attributes.endpoint_name)

    @property
    def endpoint_name(self) -> str:
        return self._endpoint_name

    @property
    def endpoint_arn(self) -> str:
        """The endpoint's ARN as SageMaker writes it (the name in lowercase)."""
        return self._arns[0]

    @property
    def bucket(self) -> s3.IBucket:
        return self._bucket

    @property
    def encryption_key(self) -> kms.IKey:
        return self._key

    def _invoke_arns(self) -> list[str]:
        return list(self._arns)
