"""Where the endpoint's model (and optionally the model build) runs in a VPC.

Facts this construct is built on (AWS developer guide, "Give SageMaker hosted endpoints access to
resources in your Amazon VPC" and "Run training and inference containers in internet-free mode"):

- A model with ``VpcConfig`` gets network interfaces in the given subnets, which must span at
  least two Availability Zones even for one instance.
- Without internet access the model cannot reach S3 unless the VPC has an S3 endpoint; with a
  VPC, SageMaker's own download of the model artifacts is routed through the VPC's subnets. The
  S3 gateway endpoint is the one endpoint the guide requires.
- With network isolation the container makes no network call at all (SageMaker downloads the
  models outside it), so the container itself needs no endpoint. The interface endpoints (ECR
  api/dkr for the image, CloudWatch Logs and monitoring, STS...) are optional here: created on
  request, they keep working a container that is not isolated and any SageMaker traffic routed
  through the VPC without a NAT gateway.
- The model build's Lambda functions call S3 and CloudFormation (``DescribeStacks``); in an
  isolated VPC they reach S3 through the gateway endpoint and CloudFormation through its
  interface endpoint, which is then always created. ``huggingface`` sources need the internet
  (a NAT gateway in an existing VPC); a created VPC has none.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from aws_cdk import RemovalPolicy, Stack, Token
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import custom_resources as cr
from pydantic import AfterValidator, Field

from constructs import Construct
from triton_mme_cdk.constructs.cfn_hygiene import drop_provider_role_dependency, drop_referenced_dependencies
from triton_mme_cdk.constructs.customer_key import logs_key
from triton_mme_cdk.constructs.nag_acknowledgments import (
    acknowledge,
    acknowledge_wildcard_resource,
    skip_cdk_provider_checks,
    skip_checkov,
)
from triton_mme_cdk.constructs.props import Props, Resource, unique
from triton_mme_cdk.constructs.sagemaker_limits import PropsError

#: Interface endpoints that may be created in a new VPC, by their name in ``com.amazonaws.<region>.``.
InterfaceEndpoint = Literal["ecr.api", "ecr.dkr", "logs", "monitoring", "sts", "cloudformation", "sagemaker.runtime"]
INTERFACE_ENDPOINT_SERVICES: dict[InterfaceEndpoint, ec2.InterfaceVpcEndpointAwsService] = {
    "ecr.api": ec2.InterfaceVpcEndpointAwsService.ECR,
    "ecr.dkr": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "monitoring": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_MONITORING,
    "sts": ec2.InterfaceVpcEndpointAwsService.STS,
    "cloudformation": ec2.InterfaceVpcEndpointAwsService.CLOUDFORMATION,
    "sagemaker.runtime": ec2.InterfaceVpcEndpointAwsService.SAGEMAKER_RUNTIME,
}
DEFAULT_INTERFACE_ENDPOINTS: tuple[InterfaceEndpoint, ...] = ("ecr.api", "ecr.dkr", "logs", "monitoring")
HTTPS = ec2.Port.tcp(443)
#: Construct id of the provider CDK adds to the stack to strip the default security group's rules.
RESTRICT_DEFAULT_SG_PROVIDER_ID = "Custom::VpcRestrictDefaultSGCustomResourceProvider"
#: CDK's built-in CloudFormation validation rules that reject the placeholder ids of a pending
#: ``Vpc.from_lookup`` (``vpc-12345``, ``p-12345``): VPC id format, subnet id format and pattern.
PLACEHOLDER_ID_RULES: tuple[str, ...] = (
    "CloudFormation-Validate::E1151",
    "CloudFormation-Validate::E1154",
    "CloudFormation-Validate::F3031",
)


#: The fields of an ``ec2.SubnetSelection`` (``select_subnets`` takes them as keywords).
SUBNET_SELECTION_FIELDS = ("availability_zones", "one_per_az", "subnet_filters", "subnet_group_name", "subnets",
                           "subnet_type")
# ECR serves image layers from this bucket of the region; a pull through the VPC reads it through
# the S3 gateway endpoint, so its policy allows s3:GetObject on it (Amazon ECR user guide, "Amazon
# ECR interface VPC endpoints (AWS PrivateLink)": minimum Amazon S3 bucket permissions).
ECR_LAYER_BUCKET, S3_GATEWAY_ID = "prod-{region}-starport-layer-bucket", "S3"
#: The egress rule CDK writes for a group that allows no outbound traffic (it matches nothing).
NO_TRAFFIC_RULE: dict[str, Any] = {"CidrIp": "255.255.255.255/32", "Description": "Disallow all traffic", "FromPort": 252,
                   "IpProtocol": "icmp", "ToPort": 86}
#: The construct id of the one function CDK's AwsCustomResource adds to a stack.
AWS_CUSTOM_RESOURCE_ID = "AWS679f53fac002430cb0da5b7982bd2287"


def _private_cidr(value: str) -> str:
    try:
        network = ipaddress.IPv4Network(value, strict=True)
    except ValueError as error:
        raise ValueError(f"got {value!r}; expected an IPv4 CIDR block such as 10.0.0.0/16 ({error})") from None
    if not network.is_private or not 16 <= network.prefixlen <= 24:
        raise ValueError(f"got {value!r}; expected a private IPv4 range from /16 to /24")
    return value


def _zones(subnets: Sequence[ec2.ISubnet]) -> set[str]:
    return {subnet.availability_zone for subnet in subnets}


class EndpointNetworkProps(Props):
    """Props of :class:`EndpointNetwork`."""

    vpc: Resource[ec2.IVpc] | None = Field(
        default=None, description="An existing VPC (e.g. ec2.Vpc.from_lookup). Unset: a VPC is created."
    )
    subnets: Resource[ec2.SubnetSelection] | None = Field(
        default=None,
        description="The model's subnets in the given VPC (private or isolated, in at least two "
        "Availability Zones). Unset: its isolated subnets, else its private ones.",
    )
    security_groups: list[Resource[ec2.ISecurityGroup]] | None = Field(
        default=None,
        description="The model's security groups (they must let it reach S3 over HTTPS). Unset: one is "
        "created with no inbound rule and HTTPS out only.",
    )
    cidr: Annotated[str, AfterValidator(_private_cidr)] = Field(
        default="10.0.0.0/16", description="IPv4 range of the created VPC (a private /16 to /24)."
    )
    interface_endpoints: Annotated[list[InterfaceEndpoint], AfterValidator(unique)] = Field(
        default_factory=lambda: list(DEFAULT_INTERFACE_ENDPOINTS),
        description="Interface endpoints of the created VPC (ecr.api, ecr.dkr, logs, monitoring, sts, "
        "cloudformation, sagemaker.runtime). Only S3 (always created) is required by an isolated "
        "model; these are for a non-isolated container and any SageMaker traffic routed through the "
        "VPC. cloudformation is added with build_access.",
    )
    build_access: bool = Field(
        default=False,
        description="Run the model build functions in the VPC too (they need S3 and CloudFormation: "
        "endpoints in a created VPC, NAT or endpoints in an existing one; huggingface sources need the "
        "internet).",
    )
    flow_log_retention: logs.RetentionDays = Field(
        default=logs.RetentionDays.ONE_MONTH, description="Retention of a created VPC's flow logs."
    )
    removal_policy: RemovalPolicy = Field(
        default=RemovalPolicy.RETAIN,
        description="Of the created VPC's flow log group: RETAIN keeps it when the stack is deleted.",
    )
    log_key: Resource[kms.IKey] | None = Field(
        default=None,
        description="Customer key that encrypts the created VPC's flow log group (its policy gets a "
        "statement for CloudWatch Logs). Unset: CloudWatch Logs' default encryption at rest.",
    )


class EndpointNetwork(Construct):
    """Subnets and security groups for the model (and the model build) in a VPC.

    With ``vpc`` given (an existing VPC, e.g. ``ec2.Vpc.from_lookup``), the model goes to its
    isolated subnets, or to its private subnets with egress when it has no isolated ones; the
    build goes to its private subnets with egress when it has any (the build may need the
    internet), else to the isolated ones. Public subnets are never used. Nothing is added to an
    existing VPC but security groups: it must route S3 (gateway endpoint or NAT) itself.

    Without ``vpc``, a VPC is created: two Availability Zones, isolated subnets only (no internet
    gateway, no NAT), flow logs to CloudWatch Logs, the S3 gateway endpoint, the requested
    interface endpoints (sharing one security group reachable on 443 only from the model's and the
    build's security groups), and a default security group stripped of its rules (CDK's
    ``restrict_default_security_group``, a small custom resource).

    Security groups have no inbound rule; outbound is HTTPS (TCP 443) only. In a created VPC the
    created groups send it only to S3's managed prefix list (routed by the gateway endpoint; its id
    is read at deploy time by a CDK AwsCustomResource) and to the interface endpoints' group.

    The created VPC's S3 gateway endpoint has a policy: only the buckets :meth:`allow_s3` names
    (the model bucket, the build's manifest asset and S3 sources) and ECR's image-layer bucket of
    the region (:data:`ECR_LAYER_BUCKET`) can be reached through it, whoever asks.
    """

    def __init__(self, scope: Construct, id: str, *, props: EndpointNetworkProps | None = None) -> None:
        super().__init__(scope, id)
        props = props or EndpointNetworkProps()
        #: Whether the VPC was created here.
        self.created = props.vpc is None
        self.vpc: ec2.IVpc = props.vpc if props.vpc is not None else self._create_vpc(props)
        #: True on the first synthesis of a looked-up VPC that is not in the context yet: the CDK
        #: CLI then performs the lookup and synthesizes again with the real VPC.
        self.pending_lookup = bool(self.vpc.select_subnets().is_pending_lookup)
        if self.pending_lookup:
            self._acknowledge_placeholders()
        isolated, egress = list(self.vpc.isolated_subnets), list(self.vpc.private_subnets)
        if props.subnets is not None:
            selection = {name: getattr(props.subnets, name) for name in SUBNET_SELECTION_FIELDS
                         if getattr(props.subnets, name) is not None}
            model_subnets = list(self.vpc.select_subnets(**selection).subnets)
            public = {subnet.subnet_id for subnet in self.vpc.public_subnets}
            if any(subnet.subnet_id in public for subnet in model_subnets):
                raise PropsError("vpc_subnets: selects public subnets; the model goes to private or isolated "
                                 "subnets only (SubnetType.PRIVATE_ISOLATED or PRIVATE_WITH_EGRESS)")
        else:
            model_subnets = isolated if len(_zones(isolated)) >= 2 else egress
        if len(_zones(model_subnets)) < 2:
            raise PropsError(
                f"vpc: {self._vpc_name()} has no isolated or private subnets in two Availability Zones"
                + (" among those vpc_subnets selects" if props.subnets is not None else "")
                + "; SageMaker needs the model's subnets in at least two (public subnets are not used)"
            )
        #: Subnets of the model's network interfaces.
        self.model_subnets: list[ec2.ISubnet] = model_subnets
        #: Security group created for the model (no inbound rule, HTTPS out only); None when given.
        self.model_security_group: ec2.SecurityGroup | None = None
        if props.security_groups is None:
            self.model_security_group = self._security_group(
                "ModelSecurityGroup", "Triton multi-model endpoint model: no inbound, HTTPS out"
            )
        #: The model's security groups: the given ones, or the created one.
        self.model_security_groups: list[ec2.ISecurityGroup] = (
            [self.model_security_group] if self.model_security_group is not None else list(props.security_groups or []))
        #: Subnets and security group of the model build (None without ``build_access``).
        self.build_subnets: list[ec2.ISubnet] | None = None
        self.build_security_group: ec2.SecurityGroup | None = None
        #: Whether the build subnets have a route out of the VPC (a NAT gateway or the like).
        self.build_has_internet = False
        if props.build_access:
            self._build_access(isolated, egress)
        #: The interface endpoints created, by service name.
        self.interface_endpoints: dict[str, ec2.InterfaceVpcEndpoint] = {}
        #: Security group of the interface endpoints (None when there are none).
        self.endpoint_security_group: ec2.SecurityGroup | None = None
        build: list[InterfaceEndpoint] = ["cloudformation"] if props.build_access else []
        wanted = list(dict.fromkeys([*props.interface_endpoints, *build]))
        if self.created and wanted:
            self._interface_endpoints(wanted, isolated)
        if self.created:
            self._egress_to_endpoints(props)

    @property
    def s3_gateway(self) -> ec2.GatewayVpcEndpoint | None:
        """The created VPC's S3 gateway endpoint (None for a VPC given)."""
        if not self.created:
            return None
        found = self.vpc.node.try_find_child(S3_GATEWAY_ID)
        assert isinstance(found, ec2.GatewayVpcEndpoint)
        return found

    def allow_s3(self, actions: Sequence[str], resources: Sequence[str]) -> None:
        """Allow ``actions`` on ``resources`` through the created VPC's S3 gateway endpoint (its
        policy; any principal: what a role may do stays its IAM policy's). No-op for a VPC given:
        its endpoints are not this construct's."""
        gateway = self.s3_gateway
        if gateway is not None and resources:
            gateway.add_to_policy(iam.PolicyStatement(
                principals=[iam.AnyPrincipal()], actions=list(actions), resources=list(resources)))

    def _vpc_name(self) -> str:
        """The VPC as a message names it: its id, or its construct path for one of this app (whose
        id is known only at deploy time)."""
        return self.vpc.node.path if Token.is_unresolved(self.vpc.vpc_id) else self.vpc.vpc_id

    def _acknowledge_placeholders(self) -> None:
        # The placeholder VPC's ids are not real ids; only this pass is exempt from their format
        # checks (the template that is deployed comes from the second pass).
        for rule in PLACEHOLDER_ID_RULES:
            acknowledge(
                Stack.of(self),
                rule,
                "Placeholder ids of a pending Vpc.from_lookup (vpc-12345, p-12345); the CDK CLI "
                "performs the lookup and synthesizes again with the real ids, checked in full.",
            )

    def _build_access(self, isolated: list[ec2.ISubnet], egress: list[ec2.ISubnet]) -> None:
        build_subnets = egress if egress else isolated
        if not build_subnets:
            raise PropsError(f"vpc: {self._vpc_name()} has no isolated or private subnet for the model build")
        self.build_subnets = build_subnets
        self.build_has_internet = bool(egress)
        self.build_security_group = self._security_group(
            "BuildSecurityGroup", "Triton model build functions: no inbound, HTTPS out"
        )

    def _interface_endpoints(self, wanted: list[InterfaceEndpoint], isolated: list[ec2.ISubnet]) -> None:
        group = ec2.SecurityGroup(
            self,
            "EndpointSecurityGroup",
            vpc=self.vpc,
            description="Interface VPC endpoints: HTTPS from the model and the build only",
            allow_all_outbound=False,
        )
        for source in (*self.model_security_groups, self.build_security_group):
            if source is not None:
                group.add_ingress_rule(source, HTTPS, f"HTTPS from {source.node.id}")
        self.endpoint_security_group = group
        for name in wanted:
            self.interface_endpoints[name] = self.vpc.add_interface_endpoint(
                "".join(part.capitalize() for part in name.split(".")) + "Endpoint",
                service=INTERFACE_ENDPOINT_SERVICES[name],
                subnets=ec2.SubnetSelection(subnets=isolated),
                private_dns_enabled=True,
                security_groups=[group],
                open=False,
            )

    def _create_vpc(self, props: EndpointNetworkProps) -> ec2.Vpc:
        vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(props.cidr),
            max_azs=2,
            nat_gateways=0,
            # Whatever the app's feature flag (@aws-cdk/aws-ec2:restrictDefaultSecurityGroup) says:
            # the packs' VPCDefaultSecurityGroupClosed (issue 59).
            restrict_default_security_group=True,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="Isolated", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)
            ],
            gateway_endpoints={S3_GATEWAY_ID: ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)},
        )
        # Image pulls through the VPC read ECR's layer bucket (the first statement replaces the
        # endpoint's default full-access policy; allow_s3 adds the stack's buckets).
        stack = Stack.of(self)
        layers = stack.format_arn(service="s3", region="", account="",
                                  resource=ECR_LAYER_BUCKET.format(region=stack.region), resource_name="*")
        s3_gateway = vpc.node.find_child(S3_GATEWAY_ID)
        assert isinstance(s3_gateway, ec2.GatewayVpcEndpoint)
        s3_gateway.add_to_policy(iam.PolicyStatement(
            sid="EcrImageLayers", principals=[iam.AnyPrincipal()], actions=["s3:GetObject"], resources=[layers]))
        key = logs_key(props.log_key)
        flow_logs = logs.LogGroup(
            self, "FlowLogs", retention=props.flow_log_retention, removal_policy=props.removal_policy,
            encryption_key=key,
        )
        if key is None:
            skip_checkov(
                flow_logs,
                ["CKV_AWS_158"],
                "No customer key given (the log_key prop): the flow log group keeps CloudWatch Logs' "
                "default encryption at rest (AWS-owned keys); its records are connection metadata "
                "(addresses, ports, bytes), no payload.",
            )
        vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs),
            traffic_type=ec2.FlowLogTrafficType.ALL,
        )
        drop_provider_role_dependency(self, RESTRICT_DEFAULT_SG_PROVIDER_ID)
        skip_cdk_provider_checks(
            self,
            RESTRICT_DEFAULT_SG_PROVIDER_ID,
            "removes the rules of the created VPC's default security group",
            "the EC2 API (revoke the default security group's rules)",
        )
        return vpc

    def _security_group(self, id: str, description: str) -> ec2.SecurityGroup:
        group = ec2.SecurityGroup(self, id, vpc=self.vpc, description=description, allow_all_outbound=False)
        if not self.created:  # a created VPC's groups reach its endpoints only (_egress_to_endpoints)
            group.add_egress_rule(ec2.Peer.any_ipv4(), HTTPS, "HTTPS to AWS endpoints (VPC endpoints in an isolated VPC)")
        return group

    def _lookup_logs(self, props: EndpointNetworkProps) -> logs.LogGroup:
        key = logs_key(props.log_key)
        group = logs.LogGroup(self, "S3PrefixListLogs", retention=props.flow_log_retention,
                              removal_policy=props.removal_policy, encryption_key=key)
        if key is None:
            skip_checkov(group, ["CKV_AWS_158"], "No customer key given (the log_key prop): the prefix list "
                         "lookup's log group keeps CloudWatch Logs' default encryption at rest; it logs the lookup.")
        return group

    def _egress_to_endpoints(self, props: EndpointNetworkProps) -> None:
        """In a created VPC, the created groups send HTTPS only to S3 (the managed prefix list of the
        region's S3 service, which the gateway endpoint routes) and to the interface endpoints'
        security group. The prefix list's id is read at deploy time (``ec2:DescribePrefixLists``,
        a CDK AwsCustomResource): CloudFormation exposes none for a gateway endpoint."""
        groups = [g for g in (self.model_security_group, self.build_security_group) if g is not None]
        if not groups:
            return
        lookup = cr.AwsCustomResource(
            self, "S3PrefixList",
            on_update=cr.AwsSdkCall(
                service="EC2", action="describePrefixLists",
                parameters={"Filters": [{"Name": "prefix-list-name",
                                         "Values": [ec2.GatewayVpcEndpointAwsService.S3.name]}]},
                physical_resource_id=cr.PhysicalResourceId.of("s3-prefix-list"),
                output_paths=["PrefixLists.0.PrefixListId"],
            ),
            policy=cr.AwsCustomResourcePolicy.from_sdk_calls(resources=cr.AwsCustomResourcePolicy.ANY_RESOURCE),
            install_latest_aws_sdk=False,
            log_group=self._lookup_logs(props),
        )
        acknowledge_wildcard_resource(lookup, "*", "ec2:DescribePrefixLists supports no resource-level "
                                      "permissions (Service Authorization Reference, Amazon EC2).")
        function = Stack.of(self).node.try_find_child(AWS_CUSTOM_RESOURCE_ID)
        assert function is not None
        drop_referenced_dependencies(function, [function.node.find_child("ServiceRole").node.default_child])
        what = "CDK's AwsCustomResource function, which reads the S3 prefix list's id (ec2:DescribePrefixLists)"
        skip_checkov(function, ["CKV_AWS_115"], f"{what}: it runs only when CloudFormation creates or updates the "
                     "lookup; a reserved concurrency would withhold capacity from the account's other functions.")
        skip_checkov(function, ["CKV_AWS_116"], f"{what}: CloudFormation invokes it and waits for its answer; a "
                     "failure fails the lookup and rolls the stack back, visibly: nothing for a queue to keep.")
        skip_checkov(function, ["CKV_AWS_117"], f"{what}: it calls only the EC2 API and CloudFormation's "
                     "response URL, over TLS with signed requests, and serves no network endpoint; the created "
                     "VPC has no EC2 endpoint to call it through.")
        acknowledge(function, "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
                    "AWSLambdaBasicExecutionRole]", "CDK's AwsCustomResource function (it reads the S3 prefix "
                    "list's id): CDK gives its role this managed policy, which writes its own logs only.")
        s3 = ec2.Peer.prefix_list(lookup.get_response_field("PrefixLists.0.PrefixListId"))
        for group in groups:
            # The rules below are resources of their own (their peers are tokens); an inline rule that
            # matches nothing keeps SecurityGroupEgress given, so EC2's default allow-all rule is not
            # created (CloudFormation adds it only when no egress rule is given).
            cfn_group = group.node.default_child
            assert isinstance(cfn_group, ec2.CfnSecurityGroup)
            cfn_group.security_group_egress = [ec2.CfnSecurityGroup.EgressProperty(
                cidr_ip=NO_TRAFFIC_RULE["CidrIp"], description=NO_TRAFFIC_RULE["Description"], ip_protocol="icmp",
                from_port=NO_TRAFFIC_RULE["FromPort"], to_port=NO_TRAFFIC_RULE["ToPort"])]
            group.add_egress_rule(s3, HTTPS, "HTTPS to S3 through the VPC's gateway endpoint")
            if self.endpoint_security_group is not None:
                group.add_egress_rule(self.endpoint_security_group, HTTPS, "HTTPS to the VPC's interface endpoints")
