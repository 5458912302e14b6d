"""Hostile and mistyped context settings (``-c mme:...``): ``python app.py`` (what ``cdk synth``
runs) refuses each with one error naming the key, before any construct or template, in bounded
time and memory. The CDK CLI hands ``-c`` values to the app as strings in ``CDK_CONTEXT_JSON``,
which is how these runs pass them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile_helpers import (
    SYNTH_TIME_LIMIT_S,
    Outcome,
    assert_refused,
    run_app_refusals,
)

from app import cdk_json_context
from triton_mme_cdk.stacks.settings import MAX_CONTEXT_VALUE_CHARS, SettingsError

#: name -> (context, fragments the error line must hold)
CORPUS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "typo": ({"mme:instace_type": "ml.g5.xlarge"},
             ("mme:instace_type: unknown setting", "did you mean mme:instance_type", "known settings: mme:stack_name")),
    "dot-instead-of-colon": ({"mme.instance_type": "ml.g5.xlarge"},
                             ("mme.instance_type", "does not start with 'mme:'", "known settings")),
    "upper-case-prefix": ({"MME:instance_type": "ml.g5.xlarge"}, ("MME:instance_type", "does not start with 'mme:'")),
    "wrong-type": ({"mme:max_instance_count": "many"}, ("mme:max_instance_count", '"many"', "integer")),
    "huge-value": ({"mme:stack_name": "A" * 100_000}, ("mme:stack_name", f"at most {MAX_CONTEXT_VALUE_CHARS}")),
    "huge-number": ({"mme:max_instance_count": "9" * 5000}, ("mme:max_instance_count", "5002 characters")),
    "not-json": ({"mme:triton_environment": "{SAGEMAKER_TRITON_LOG_INFO: true"},
                 ("mme:triton_environment", "expected a JSON object")),
    "json-wrong-shape": ({"mme:alarm_emails": '["a@example.com", '}, ("mme:alarm_emails", "expected a JSON array")),
    "nan": ({"mme:gpu_utilization_target": "nan"}, ("mme:gpu_utilization_target", '"nan"', "finite")),
    "inf": ({"mme:invocations_per_instance_target": "inf"}, ("mme:invocations_per_instance_target", "finite")),
}


#: The entry run as ``python app.py`` in a fresh process; the others share one (``run_app_refusals``).
FRESH = min(CORPUS)


@pytest.fixture(scope="module")
def synth_refusals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Outcome, Path]]:
    root = tmp_path_factory.mktemp("synth")
    cases = {name: (CORPUS[name][0], root / name / "cdk.out") for name in sorted(CORPUS)}
    outcomes = run_app_refusals(cases, root / "_runs", fresh=FRESH)
    return {name: (outcomes[name], cases[name][1]) for name in cases}


@pytest.mark.slow  # a CDK app (Node.js, jsii); tests/test_settings.py refuses wrong settings in-process
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_synth_refuses_context(name: str, synth_refusals: dict[str, tuple[Outcome, Path]]) -> None:
    outcome, out = synth_refusals[name]
    assert_refused(outcome, *CORPUS[name][1], time_limit=SYNTH_TIME_LIMIT_S)
    assert not list(out.glob("*.template.json")), "a refused setting must not write a template"


@pytest.mark.parametrize("text", ['{"context": {"mme:x": 1,}}', "\xff\xfe", '["context"]'],
                         ids=["trailing-comma", "not-utf8", "not-an-object"])
def test_broken_cdk_json_is_one_error(text: str, tmp_path: Path) -> None:
    (tmp_path / "cdk.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(SettingsError, match=r"cdk\.json"):
        cdk_json_context(tmp_path)
