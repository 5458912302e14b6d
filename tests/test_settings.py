"""MmeSettings: defaults, coercion of ``-c`` strings, and one clear message per bad value."""

from __future__ import annotations

import re

import pytest
from cdk_helpers import ROOT  # (also puts the project root on sys.path)
from pydantic import ValidationError

from triton_mme_cdk.constructs.sagemaker_limits import MME_GPU_INSTANCE_TYPES, TRITON_EXTRA_KEYS
from triton_mme_cdk.constructs.triton_image import load_image_table
from triton_mme_cdk.stacks.settings import MmeSettings, SettingsError


def settings(**values: object) -> MmeSettings:
    return MmeSettings.from_context({f"mme:{k}": v for k, v in values.items()})


def error_of(**values: object) -> str:
    with pytest.raises(SettingsError) as caught:
        settings(**values)
    return str(caught.value)


def test_defaults() -> None:
    s = settings()
    assert s.stack_name == "TritonMme"
    assert s.endpoint_name == "triton-mme"
    assert s.instance_type == "ml.g5.xlarge"
    assert (s.initial_instance_count, s.min_instance_count, s.max_instance_count) == (1, 1, 4)
    assert (s.invocations_per_instance_target, s.invocations_scale_in_cooldown_seconds,
            s.invocations_scale_out_cooldown_seconds) == (70, 600, 300)
    assert (s.gpu_utilization_target, s.gpu_scale_in_cooldown_seconds,
            s.gpu_scale_out_cooldown_seconds) == (60, 600, 200)
    assert s.triton_image_version is None
    assert (s.shm_default_byte_size, s.shm_growth_byte_size) == (16777216, 1048576)
    assert s.triton_log_verbose is False
    assert s.triton_environment == {}
    assert s.model_cache == "Enabled"
    assert s.model_data_download_timeout_seconds == 600
    assert s.container_startup_health_check_timeout_seconds == 600
    assert s.volume_size_gb is None
    assert s.model_prefix == "models"
    assert (s.noncurrent_version_expiration_days, s.retired_release_expiration_days,
            s.access_log_expiration_days) == (30, 30, 365)
    assert s.bucket_removal_policy == "retain"
    assert s.manifest_path == "models.yaml"
    assert s.release_id is None
    assert (s.build_memory_mb, s.build_ephemeral_storage_mb, s.build_timeout_minutes) == (6144, 10240, 15)
    assert (s.build_total_timeout_minutes, s.build_query_interval_seconds) == (50, 60)
    assert s.artifacts_on_delete == "retain"
    assert (s.account, s.region) == (None, None)
    # Operations
    assert (s.alarm_5xx_errors_threshold, s.alarm_4xx_rate_percent, s.alarm_latency_p99_ms,
            s.alarm_model_loading_wait_p90_ms) == (0, 5, 1000, 10000)
    assert (s.alarm_gpu_memory_percent, s.alarm_disk_percent, s.alarm_gpu_saturation_percent) == (90, 85, 90)
    # Unset: a topic is created unless mme:alarm_topic_arn names one (issue 59: alarms with an action).
    assert (s.alarm_topic_enabled, s.alarm_emails, s.alarm_topic_arn, s.dashboard_name) == (None, [], None, None)
    assert (s.rollout_traffic, s.rollout_size_type, s.rollout_size) == ("ALL_AT_ONCE", "CAPACITY_PERCENT", None)
    assert (s.rollout_wait_seconds, s.rollout_termination_wait_seconds,
            s.rollout_max_execution_timeout_seconds) == (600, 300, None)
    assert s.rollback_alarms == ["invocation_5xx_errors", "invocation_4xx_rate", "model_latency_p99"]
    assert (s.network_isolation, s.vpc_id, s.create_vpc, s.build_in_vpc) == (True, None, False, False)
    assert s.vpc_cidr == "10.0.0.0/16"
    assert s.vpc_interface_endpoints == ["ecr.api", "ecr.dkr", "logs", "monitoring"]
    assert (s.tag_project, s.tag_environment, s.tag_owner) == ("triton-mme", "dev", "unassigned")


def test_every_field_is_documented() -> None:
    """Every field says what it does (its props field's description)."""
    undocumented = [name for name, field in MmeSettings.model_fields.items() if not field.description]
    assert undocumented == []


def test_the_settings_reference_lists_every_setting() -> None:
    """docs/settings.md's table has a row for every setting, and every row names a setting
    (a row may name several: `min_instance_count` / `max_instance_count`)."""
    text = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    section = text[text.index("\n## Settings\n"):]
    section = section[:section.index("\n## ", 1)]
    listed: set[str] = set()
    for line in section.splitlines():
        first = re.match(r"^\| (.*?) \|", line)
        if first and not first.group(1).startswith(("setting", "**", "-")):
            listed |= set(re.findall(r"`([a-z0-9_]+)`", first.group(1)))
    # mme:pipeline is read by app.py beside the endpoint's settings (stacks/pipeline_settings.py).
    fields = set(MmeSettings.model_fields) | {"pipeline"}
    assert sorted(fields - listed) == [], "settings without a row in docs/settings.md"
    assert sorted(listed - fields) == [], "rows of docs/settings.md that are no setting"


def test_context_strings_are_coerced() -> None:
    s = settings(
        initial_instance_count="2",
        max_instance_count="3",
        triton_log_verbose="true",
        gpu_utilization_target="75.5",
        volume_size_gb="",
        instance_type="ml.p3.2xlarge",
        triton_environment='{"SAGEMAKER_TRITON_THREAD_COUNT": 16, "SAGEMAKER_TRITON_ALLOW_METRICS": true}',
    )
    assert s.initial_instance_count == 2 and s.max_instance_count == 3
    assert s.triton_log_verbose is True
    assert s.gpu_utilization_target == 75.5
    assert s.volume_size_gb is None
    assert s.triton_environment == {
        "SAGEMAKER_TRITON_ALLOW_METRICS": "true",
        "SAGEMAKER_TRITON_THREAD_COUNT": "16",
    }


def test_json_values_from_cdk_json_are_accepted() -> None:
    s = MmeSettings.from_context({"mme:max_instance_count": 8, "mme:triton_log_verbose": False,
                                  "mme:triton_environment": {"SAGEMAKER_TRITON_PING_MODE": "ready"}})
    assert s.max_instance_count == 8
    assert s.triton_environment == {"SAGEMAKER_TRITON_PING_MODE": "ready"}


def test_other_context_keys_are_ignored() -> None:
    s = MmeSettings.from_context({"@aws-cdk/core:target-partitions": ["aws"], "other:key": "x"})
    assert s == MmeSettings()


def test_frozen_and_no_extra_fields() -> None:
    s = MmeSettings()
    with pytest.raises(ValidationError):
        s.endpoint_name = "other"  # type: ignore[misc]  # read-only for mypy as well; refused on purpose (frozen)
    with pytest.raises(ValidationError):
        MmeSettings(unknown_field=1)  # type: ignore[call-arg]


def test_newest_image_version_is_the_default_and_versions_are_checked() -> None:
    table = load_image_table()
    assert table.newest == max(table.versions, key=lambda v: tuple(int(p) for p in v.split(".")))
    assert settings(triton_image_version=table.versions[0]).triton_image_version == table.versions[0]
    message = error_of(triton_image_version="22.01")
    assert "mme:triton_image_version: got '22.01'" in message and table.newest in message


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"instance_type": "ml.m5.xlarge"}, "mme:instance_type: got 'ml.m5.xlarge'; a GPU multi-model endpoint runs on one of ml.g4dn.xlarge"),
        ({"foo": "1"}, "mme:foo: unknown setting; known settings: mme:stack_name"),
        ({"instnce_type": "ml.g5.xlarge"}, "mme:instnce_type: unknown setting; did you mean mme:instance_type?"),
        ({"min_instance_count": "3", "max_instance_count": "2"}, "got 3, 1, 2; expected min <= initial <= max"),
        ({"initial_instance_count": "5"}, "got 1, 5, 4; expected min <= initial <= max"),
        ({"max_instance_count": "0"}, "mme:max_instance_count: got \"0\"; input should be greater than or equal to 1"),
        ({"max_instance_count": "many"}, "mme:max_instance_count: got \"many\"; input should be a valid integer"),
        ({"model_data_download_timeout_seconds": "30"}, "mme:model_data_download_timeout_seconds: got \"30\"; input should be greater than or equal to 60"),
        ({"container_startup_health_check_timeout_seconds": "3601"}, "mme:container_startup_health_check_timeout_seconds: got \"3601\"; input should be less than or equal to 3600"),
        ({"volume_size_gb": "100"}, "mme:volume_size_gb: got 100 with mme:instance_type ml.g5.xlarge; g4dn and g5"),
        ({"volume_size_gb": "100", "instance_type": "ml.g4dn.2xlarge"}, "mme:volume_size_gb: got 100 with mme:instance_type ml.g4dn.2xlarge"),
        ({"volume_size_gb": "600", "instance_type": "ml.p3.2xlarge"}, "mme:volume_size_gb: got \"600\"; input should be less than or equal to 512"),
        ({"endpoint_name": "my_endpoint"}, "mme:endpoint_name: got 'my_endpoint'; expected 1 to 63 letters, digits and single hyphens"),
        ({"endpoint_name": "e" * 64}, "expected 1 to 63 letters"),
        ({"gpu_utilization_target": "0"}, "mme:gpu_utilization_target: got \"0\"; input should be greater than 0"),
        ({"gpu_utilization_target": "101"}, "mme:gpu_utilization_target: got \"101\"; input should be less than or equal to 100"),
        ({"invocations_per_instance_target": "-1"}, "mme:invocations_per_instance_target: got \"-1\""),
        ({"model_cache": "On"}, "mme:model_cache: got \"On\"; input should be 'Enabled' or 'Disabled'"),
        ({"triton_log_verbose": "maybe"}, "mme:triton_log_verbose: got \"maybe\"; input should be a valid boolean"),
        ({"triton_environment": '{"SAGEMAKER_TRITON_BATCH_SIZE": "4"}'}, "mme:triton_environment: unknown key 'SAGEMAKER_TRITON_BATCH_SIZE'; allowed: SAGEMAKER_TRITON_ADDITIONAL_ARGS"),
        ({"triton_environment": '{"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "bert"}'}, "key 'SAGEMAKER_TRITON_DEFAULT_MODEL_NAME' is for single-model endpoints"),
        ({"triton_environment": '{"SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "1"}'}, "key 'SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE' has its own setting"),
        ({"triton_environment": '{"SAGEMAKER_TRITON_LOG_VERBOSE": "true"}'}, "key 'SAGEMAKER_TRITON_LOG_VERBOSE' has its own setting"),
        ({"triton_environment": '{"SAGEMAKER_TRITON_PING_MODE": "always"}'}, "SAGEMAKER_TRITON_PING_MODE got 'always'; expected one of ready, live"),
        ({"triton_environment": '{"SAGEMAKER_TRITON_ADDITIONAL_ARGS": "' + "x" * 1025 + '"}'}, "has 1025 characters; at most 1024 allowed"),
        ({"triton_environment": "not json"}, "mme:triton_environment: got 'not json'; expected a JSON object"),
        ({"model_prefix": "/models/"}, "mme:model_prefix: got '/models/'; expected an S3 key prefix"),
        ({"model_prefix": "models/../x"}, "mme:model_prefix: got 'models/../x'"),
        ({"bucket_removal_policy": "delete"}, "mme:bucket_removal_policy: got \"delete\"; input should be 'retain' or 'destroy'"),
        ({"artifacts_on_delete": "keep"}, "mme:artifacts_on_delete: got \"keep\"; input should be 'retain' or 'destroy'"),
        ({"manifest_path": ""}, "mme:release_id: missing with an empty mme:manifest_path"),
        ({"release_id": "r-0123456789abcdef"}, "mme:release_id: got 'r-0123456789abcdef' with mme:manifest_path 'models.yaml'"),
        ({"manifest_path": "", "release_id": "latest"}, "mme:release_id: got 'latest'; expected a release id"),
        ({"build_memory_mb": "20000"}, "mme:build_memory_mb: got \"20000\"; input should be less than or equal to 10240"),
        ({"build_ephemeral_storage_mb": "256"}, "mme:build_ephemeral_storage_mb: got \"256\"; input should be greater than or equal to 512"),
        ({"build_timeout_minutes": "16"}, "mme:build_timeout_minutes: got \"16\"; input should be less than or equal to 15"),
        ({"build_total_timeout_minutes": "120"}, "mme:build_total_timeout_minutes: got \"120\"; input should be less than or equal to 60"),
        ({"build_total_timeout_minutes": "10", "build_query_interval_seconds": "45"}, "the total timeout must be a whole multiple of the query interval"),
        # CloudFormation waits one hour: 60 polls a minute apart answer too late (tests/test_custom_resource_protocol.py).
        ({"build_total_timeout_minutes": "60"}, "mme:build_total_timeout_minutes: got 1 hour with mme:build_query_interval_seconds 1 minute; the provider's last answer would come 4270 s after CloudFormation's request, past its 3600 s wait (each of the 60 polls takes up to 10 s besides the interval): at most 3000 s (50 minutes) with this interval"),
        ({"account": "12345"}, "mme:account: got \"12345\""),
        ({"region": "moon-1"}, "mme:region: got \"moon-1\""),
        ({"region": "us-gov-west-1"}, "mme:region: got 'us-gov-west-1'; the Triton image"),
        ({"stack_name": "1stack"}, "mme:stack_name: got \"1stack\""),
        # -- Alarms and notifications
        ({"alarm_5xx_errors_threshold": "-1"}, "mme:alarm_5xx_errors_threshold: got \"-1\"; input should be greater than or equal to 0"),
        ({"alarm_4xx_rate_percent": "0"}, "mme:alarm_4xx_rate_percent: got \"0\"; input should be greater than 0"),
        ({"alarm_4xx_rate_percent": "150"}, "mme:alarm_4xx_rate_percent: got \"150\"; input should be less than or equal to 100"),
        ({"alarm_latency_p99_ms": "fast"}, "mme:alarm_latency_p99_ms: got \"fast\"; input should be a valid number"),
        ({"alarm_model_loading_wait_p90_ms": "0"}, "mme:alarm_model_loading_wait_p90_ms: got \"0\"; input should be greater than 0"),
        ({"alarm_gpu_memory_percent": "101"}, "mme:alarm_gpu_memory_percent: got \"101\"; input should be less than or equal to 100"),
        ({"alarm_disk_percent": "-5"}, "mme:alarm_disk_percent: got \"-5\"; input should be greater than 0"),
        ({"alarm_gpu_saturation_percent": "100.5"}, "mme:alarm_gpu_saturation_percent: got \"100.5\"; input should be less than or equal to 100"),
        ({"alarm_emails": "ops"}, "mme:alarm_emails: got 'ops'; expected e-mail addresses such as ops@example.com"),
        ({"alarm_emails": "a@example.com,a@example.com"}, "mme:alarm_emails: got ['a@example.com', 'a@example.com']; an address is given twice"),
        ({"alarm_emails": "[oops"}, "mme:alarm_emails: got '[oops'; expected a JSON array"),
        ({"alarm_topic_arn": "alarms"}, "mme:alarm_topic_arn: got 'alarms'; expected an SNS topic ARN such as arn:aws:sns:"),
        ({"alarm_topic_arn": "arn:aws:sns:eu-west-1:123456789012:t", "alarm_emails": "ops@example.com"},
         "mme:alarm_topic_arn: got 'arn:aws:sns:eu-west-1:123456789012:t' with mme:alarm_emails; the alarms notify either an existing topic or a created one"),
        ({"alarm_topic_arn": "arn:aws:sns:eu-west-1:123456789012:t", "alarm_topic_enabled": "true"},
         "with mme:alarm_topic_enabled true; the alarms notify either"),
        ({"alarm_topic_enabled": "sometimes"}, "mme:alarm_topic_enabled: got \"sometimes\"; input should be a valid boolean"),
        ({"alarm_topic_enabled": "false", "alarm_emails": "ops@example.com"},
         "mme:alarm_emails: given with mme:alarm_topic_enabled false; the addresses subscribe to the created topic"),
        ({"dashboard_name": "my dashboard"}, "mme:dashboard_name: got 'my dashboard'; expected 1 to 255 letters, digits, '-' and '_'"),
        # -- Safe rollouts
        ({"rollout_traffic": "BLUE_GREEN"}, "mme:rollout_traffic: got \"BLUE_GREEN\"; input should be 'ALL_AT_ONCE', 'CANARY' or 'LINEAR'"),
        ({"rollout_size_type": "PERCENT"}, "mme:rollout_size_type: got \"PERCENT\"; input should be 'INSTANCE_COUNT' or 'CAPACITY_PERCENT'"),
        ({"rollout_traffic": "CANARY"}, "mme:rollout_size: missing with mme:rollout_traffic CANARY; give the canary size"),
        ({"rollout_traffic": "LINEAR"}, "mme:rollout_size: missing with mme:rollout_traffic LINEAR; give the linear step size"),
        ({"rollout_size": "10"}, "mme:rollout_size: got 10 with mme:rollout_traffic ALL_AT_ONCE; a size is for CANARY or LINEAR only"),
        ({"rollout_traffic": "CANARY", "rollout_size": "0"}, "mme:rollout_size: got 0; expected at least 1"),
        ({"rollout_traffic": "CANARY", "rollout_size": "75"}, "mme:rollout_size: got 75 percent with mme:rollout_traffic CANARY; expected 1 to 50 percent"),
        ({"rollout_traffic": "LINEAR", "rollout_size": "5"}, "mme:rollout_size: got 5 percent with mme:rollout_traffic LINEAR; expected 10 to 50 percent"),
        ({"rollout_traffic": "CANARY", "rollout_size_type": "INSTANCE_COUNT", "rollout_size": "1"},
         "mme:rollout_size: got 1 instances with mme:rollout_traffic CANARY and mme:min_instance_count 1; a canary step may be at most 50% of the variant's instances, so at most 0 here"),
        ({"rollout_traffic": "LINEAR", "rollout_size_type": "INSTANCE_COUNT", "rollout_size": "1",
          "min_instance_count": "2", "initial_instance_count": "2", "max_instance_count": "20"},
         "mme:rollout_size: got 1 instances with mme:rollout_traffic LINEAR and mme:max_instance_count 20; a linear step must be at least 10%"),
        ({"rollout_wait_seconds": "3601"}, "mme:rollout_wait_seconds: got \"3601\"; input should be less than or equal to 3600"),
        ({"rollout_termination_wait_seconds": "-1"}, "mme:rollout_termination_wait_seconds: got \"-1\"; input should be greater than or equal to 0"),
        ({"rollout_max_execution_timeout_seconds": "300"}, "mme:rollout_max_execution_timeout_seconds: got \"300\"; input should be greater than or equal to 600"),
        ({"rollout_max_execution_timeout_seconds": "30000"}, "mme:rollout_max_execution_timeout_seconds: got \"30000\"; input should be less than or equal to 28800"),
        ({"rollout_max_execution_timeout_seconds": "800"},
         "mme:rollout_max_execution_timeout_seconds: got 800 with 1 wait(s) of mme:rollout_wait_seconds 600 and mme:rollout_termination_wait_seconds 300; expected more than the 900 s"),
        ({"rollback_alarms": "latency"}, "mme:rollback_alarms.0: got \"latency\"; input should be 'invocation_5xx_errors', 'invocation_4xx_rate'"),
        ({"rollback_alarms": "disk,disk"}, "mme:rollback_alarms: got ['disk', 'disk']; disk given twice"),
        # -- Network
        ({"network_isolation": "maybe"}, "mme:network_isolation: got \"maybe\"; input should be a valid boolean"),
        ({"vpc_id": "my-vpc"}, "mme:vpc_id: got 'my-vpc'; expected a VPC id such as vpc-0123456789abcdef0"),
        ({"vpc_id": "vpc-0123456789abcdef0"},
         "mme:vpc_id: got 'vpc-0123456789abcdef0' without mme:account and mme:region; an existing VPC is looked up (ec2.Vpc.from_lookup) in one account and region"),
        ({"vpc_id": "vpc-0123456789abcdef0", "region": "eu-west-1"}, "mme:vpc_id: got 'vpc-0123456789abcdef0' without mme:account; an existing VPC is looked up"),
        ({"vpc_id": "vpc-0123456789abcdef0", "create_vpc": "true", "account": "123456789012", "region": "eu-west-1"},
         "mme:vpc_id: got 'vpc-0123456789abcdef0' with mme:create_vpc true; place the model in an existing VPC or in a created one, not both"),
        ({"create_vpc": "true", "vpc_cidr": "10.0.0.0/8"}, "mme:vpc_cidr: got '10.0.0.0/8'; expected a private IPv4 range from /16 to /24"),
        ({"create_vpc": "true", "vpc_cidr": "8.8.0.0/16"}, "mme:vpc_cidr: got '8.8.0.0/16'; expected a private IPv4 range"),
        ({"create_vpc": "true", "vpc_cidr": "10.0.0.1/16"}, "mme:vpc_cidr: got '10.0.0.1/16'; expected an IPv4 CIDR block such as 10.0.0.0/16"),
        ({"vpc_cidr": "10.1.0.0/16"}, "mme:vpc_cidr: got '10.1.0.0/16' without mme:create_vpc true; the range is for a created VPC"),
        ({"create_vpc": "true", "vpc_interface_endpoints": "ecr,logs"}, "mme:vpc_interface_endpoints.0: got \"ecr\"; input should be 'ecr.api', 'ecr.dkr'"),
        ({"vpc_interface_endpoints": "logs"}, "mme:vpc_interface_endpoints: got ['logs'] without mme:create_vpc true; endpoints are only added to a created VPC"),
        ({"build_in_vpc": "true"}, "mme:build_in_vpc: got true without a VPC; set mme:vpc_id or mme:create_vpc true"),
        ({"build_in_vpc": "true", "create_vpc": "true", "manifest_path": "", "release_id": "r-0123456789abcdef"},
         "mme:build_in_vpc: got true with an empty mme:manifest_path; there is no build to place in the VPC"),
        # -- Tags
        ({"tag_project": ""}, "mme:tag_project: got ''; expected 1 to 256 letters, digits, spaces and _ . : / = + - @"),
        ({"tag_owner": "team#1"}, "mme:tag_owner: got 'team#1'; expected 1 to 256 letters"),
        ({"tag_environment": "aws:prod"}, "mme:tag_environment: got 'aws:prod'; expected 1 to 256 letters, digits, spaces and _ . : / = + - @, not starting with 'aws:'"),
        ({"tag_environment": "x" * 257}, "mme:tag_environment: got 'xxxx"),
    ],
)
def test_bad_values_give_one_clear_message(values: dict[str, object], expected: str) -> None:
    message = error_of(**values)
    assert expected in message
    assert "Traceback" not in message
    # One problem, one line (a bad value is not reported twice).
    assert len(message.splitlines()) == 1, message


def test_several_problems_are_all_reported() -> None:
    message = error_of(max_instance_count="x", model_cache="On")
    assert "mme:max_instance_count" in message and "mme:model_cache" in message


def test_settings_lists_match_the_limits_module() -> None:
    assert settings(instance_type="ml.g4dn.16xlarge").instance_type == "ml.g4dn.16xlarge"
    for instance_type in MME_GPU_INSTANCE_TYPES:
        if instance_type == "ml.p2.xlarge":  # listed by SageMaker, refused by the GPU host check (K80)
            continue
        assert settings(instance_type=instance_type).instance_type == instance_type
    env = {key: "1" for key in sorted(TRITON_EXTRA_KEYS) if key not in {
        "SAGEMAKER_TRITON_PING_MODE", "SAGEMAKER_TRITON_INFERENCE_TYPE"}}
    assert settings(triton_environment=env).triton_environment == env


def test_volume_size_on_ebs_instance_types() -> None:
    assert settings(instance_type="ml.p3.2xlarge", volume_size_gb="64").volume_size_gb == 64


def test_release_mode() -> None:
    s = settings(manifest_path="", release_id="r-0123456789abcdef")
    assert s.manifest_path == "" and s.release_id == "r-0123456789abcdef"


def test_operations_settings_from_context_strings() -> None:
    s = settings(
        alarm_emails='["ops@example.com", "oncall@example.com"]',
        rollback_alarms="invocation_5xx_errors, gpu_memory",
        create_vpc="true",
        vpc_interface_endpoints="",
        rollout_traffic="LINEAR",
        rollout_size_type="INSTANCE_COUNT",
        rollout_size="2",
        min_instance_count="4",
        initial_instance_count="4",
        max_instance_count="10",
        rollout_max_execution_timeout_seconds="7200",
        dashboard_name="",
        tag_owner="ml platform/oncall@example.com",
    )
    assert s.alarm_emails == ["ops@example.com", "oncall@example.com"]
    assert s.rollback_alarms == ["invocation_5xx_errors", "gpu_memory"]
    assert s.vpc_interface_endpoints == []
    assert (s.rollout_traffic, s.rollout_size_type, s.rollout_size) == ("LINEAR", "INSTANCE_COUNT", 2)
    assert s.dashboard_name is None
    assert settings(rollback_alarms="").rollback_alarms == []
    assert settings(alarm_topic_arn="arn:aws-cn:sns:cn-north-1:123456789012:alarms").alarm_topic_arn


def test_vpc_lookup_needs_both_account_and_region() -> None:
    s = settings(vpc_id="vpc-0123456789abcdef0", account="123456789012", region="eu-west-1", build_in_vpc="true")
    assert (s.vpc_id, s.build_in_vpc) == ("vpc-0123456789abcdef0", True)
