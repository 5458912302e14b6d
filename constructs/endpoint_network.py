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

from collections.abc import Sequence

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs

from constructs import Construct
from constructs.cfn_hygiene import drop_referenced_dependencies
from constructs.nag_acknowledgments import acknowledge
from constructs.sagemaker_limits import PropsError

#: Interface endpoints that may be created in a new VPC, by their name in ``com.amazonaws.<region>.``.
INTERFACE_ENDPOINT_SERVICES: dict[str, ec2.InterfaceVpcEndpointAwsService] = {
    "ecr.api": ec2.InterfaceVpcEndpointAwsService.ECR,
    "ecr.dkr": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "monitoring": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_MONITORING,
    "sts": ec2.InterfaceVpcEndpointAwsService.STS,
    "cloudformation": ec2.InterfaceVpcEndpointAwsService.CLOUDFORMATION,
    "sagemaker.runtime": ec2.InterfaceVpcEndpointAwsService.SAGEMAKER_RUNTIME,
}
DEFAULT_INTERFACE_ENDPOINTS: tuple[str, ...] = ("ecr.api", "ecr.dkr", "logs", "monitoring")
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


def _zones(subnets: Sequence[ec2.ISubnet]) -> set[str]:
    return {subnet.availability_zone for subnet in subnets}


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

    Security groups have no inbound rule; outbound is HTTPS (TCP 443) only. In a created VPC that
    reaches only the VPC endpoints (no route leaves the VPC).

    :param vpc: an existing VPC. Default: create one.
    :param cidr: IPv4 range of a created VPC. Default: ``10.0.0.0/16``.
    :param interface_endpoints: interface endpoints of a created VPC, by service name (keys of
        :data:`INTERFACE_ENDPOINT_SERVICES`). Default: :data:`DEFAULT_INTERFACE_ENDPOINTS`.
    :param build_access: also give the model build subnets and a security group (in a created
        VPC, adds the ``cloudformation`` endpoint). Default: False.
    :param flow_log_retention: retention of a created VPC's flow logs. Default: one month.
    :param removal_policy: of the flow log group. Default: ``RETAIN``.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        vpc: ec2.IVpc | None = None,
        cidr: str = "10.0.0.0/16",
        interface_endpoints: Sequence[str] = DEFAULT_INTERFACE_ENDPOINTS,
        build_access: bool = False,
        flow_log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH,
        removal_policy: RemovalPolicy = RemovalPolicy.RETAIN,
    ) -> None:
        super().__init__(scope, id)
        unknown = [name for name in interface_endpoints if name not in INTERFACE_ENDPOINT_SERVICES]
        if unknown:
            raise PropsError(
                f"interface_endpoints: unknown {', '.join(map(repr, unknown))}; expected some of "
                + ", ".join(INTERFACE_ENDPOINT_SERVICES)
            )
        #: Whether the VPC was created here.
        self.created = vpc is None
        if vpc is None:
            vpc = self._create_vpc(cidr, flow_log_retention, removal_policy)
        self.vpc: ec2.IVpc = vpc
        #: True on the first synthesis of a looked-up VPC that is not in the context yet: the CDK
        #: CLI then performs the lookup and synthesizes again with the real VPC.
        self.pending_lookup = bool(vpc.select_subnets().is_pending_lookup)
        if self.pending_lookup:
            # The placeholder VPC's ids are not real ids; only this pass is exempt from their
            # format checks (the template that is deployed comes from the second pass).
            for rule in PLACEHOLDER_ID_RULES:
                acknowledge(
                    Stack.of(self),
                    rule,
                    "Placeholder ids of a pending Vpc.from_lookup (vpc-12345, p-12345); the CDK CLI "
                    "performs the lookup and synthesizes again with the real ids, checked in full.",
                )

        isolated = list(vpc.isolated_subnets)
        egress = list(vpc.private_subnets)
        model_subnets = isolated if len(_zones(isolated)) >= 2 else egress
        if len(_zones(model_subnets)) < 2:
            raise PropsError(
                f"vpc: {vpc.vpc_id} has no isolated or private subnets in two Availability Zones; "
                "SageMaker needs the model's subnets in at least two (public subnets are not used)"
            )
        #: Subnets of the model's network interfaces.
        self.model_subnets: list[ec2.ISubnet] = model_subnets
        #: Security group of the model: no inbound rule, HTTPS out only.
        self.model_security_group = self._security_group(
            "ModelSecurityGroup", "Triton multi-model endpoint model: no inbound, HTTPS out"
        )

        #: Subnets and security group of the model build (None without ``build_access``).
        self.build_subnets: list[ec2.ISubnet] | None = None
        self.build_security_group: ec2.SecurityGroup | None = None
        #: Whether the build subnets have a route out of the VPC (a NAT gateway or the like).
        self.build_has_internet = False
        if build_access:
            build_subnets = egress if egress else isolated
            if not build_subnets:
                raise PropsError(f"vpc: {vpc.vpc_id} has no isolated or private subnet for the model build")
            self.build_subnets = build_subnets
            self.build_has_internet = bool(egress)
            self.build_security_group = self._security_group(
                "BuildSecurityGroup", "Triton model build functions: no inbound, HTTPS out"
            )

        #: The interface endpoints created, by service name.
        self.interface_endpoints: dict[str, ec2.InterfaceVpcEndpoint] = {}
        #: Security group of the interface endpoints (None when there are none).
        self.endpoint_security_group: ec2.SecurityGroup | None = None
        wanted = list(dict.fromkeys([*interface_endpoints, *(["cloudformation"] if build_access else [])]))
        if self.created and wanted:
            group = ec2.SecurityGroup(
                self,
                "EndpointSecurityGroup",
                vpc=vpc,
                description="Interface VPC endpoints: HTTPS from the model and the build only",
                allow_all_outbound=False,
            )
            for source in (self.model_security_group, self.build_security_group):
                if source is not None:
                    group.add_ingress_rule(source, HTTPS, f"HTTPS from {source.node.id}")
            self.endpoint_security_group = group
            for name in wanted:
                self.interface_endpoints[name] = vpc.add_interface_endpoint(
                    "".join(part.capitalize() for part in name.split(".")) + "Endpoint",
                    service=INTERFACE_ENDPOINT_SERVICES[name],
                    subnets=ec2.SubnetSelection(subnets=isolated),
                    private_dns_enabled=True,
                    security_groups=[group],
                    open=False,
                )

    def _create_vpc(
        self, cidr: str, retention: logs.RetentionDays, removal_policy: RemovalPolicy
    ) -> ec2.Vpc:
        vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(cidr),
            max_azs=2,
            nat_gateways=0,
            subnet_configuration=[
                ec2.SubnetConfiguration(name="Isolated", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)
            ],
            gateway_endpoints={
                "S3": ec2.GatewayVpcEndpointOptions(service=ec2.GatewayVpcEndpointAwsService.S3)
            },
        )
        flow_logs = logs.LogGroup(self, "FlowLogs", retention=retention, removal_policy=removal_policy)
        vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_logs),
            traffic_type=ec2.FlowLogTrafficType.ALL,
        )
        # The provider's function references its role (Fn::GetAtt) and also depends on it
        # (cfn-lint W3005).
        provider = Stack.of(self).node.try_find_child(RESTRICT_DEFAULT_SG_PROVIDER_ID)
        if provider is not None:
            handler = provider.node.try_find_child("Handler")
            role = provider.node.try_find_child("Role")
            if handler is not None and role is not None:
                drop_referenced_dependencies(handler, [role])
        return vpc

    def _security_group(self, id: str, description: str) -> ec2.SecurityGroup:
        group = ec2.SecurityGroup(
            self, id, vpc=self.vpc, description=description, allow_all_outbound=False
        )
        group.add_egress_rule(
            ec2.Peer.any_ipv4(), HTTPS, "HTTPS to AWS endpoints (VPC endpoints in an isolated VPC)"
        )
        return group
