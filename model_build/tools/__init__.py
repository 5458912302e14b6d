"""Tools users run on their own machine: the smoke test, ``plan``, the local endpoint (and its Triton backends).

- ``smoke`` (with ``smoke_setup`` and ``smoke_cli``): invoke every target of a deployed endpoint
  and check the answers against the release's references; ``verify``: the client side of
  Triton's binary+JSON protocol it uses;
- ``plan_cli``: ``plan`` (what a change does to the models, the fleet and the data: ``plan_verdict``
  judges the template with the CDK's diff engine, ``cfn_diff.js``; ``plan_security`` who can do
  what, widened or narrowed; ``plan_report`` writes text,
  JSON of ``plan.schema.json`` and markdown, with the plan's digest), ``pr-comment``
  (``pr_comment``), ``pr-fetch`` (``pr_fetch``: a pull request's synthesized template, as
  untrusted data), ``pr-gate`` (``pr_gate``: an approval bound to the plan's digest), all three
  over GitHub's REST API (``github_api``), and ``releases``; ``doctor_cli``: ``doctor`` (the served
  bucket's invariants checked and repaired, :mod:`model_build.release.doctor`);
- ``endpoint``: a SageMaker multi-model endpoint on this machine: ``mme`` (SageMaker's part:
  loading, eviction, out-of-memory retries) over ``served_release`` (what it serves) and
  ``triton_server`` (the real ``tritonserver``, in a network namespace of its own where the host
  allows one: ``triton_netns``), with ``triton_backends``;
- ``local_s3``: moto's S3 server on loopback (demo, tests, benchmarks); ``text_sources``:
  offline text sources of every tokenizer kind (tests, benchmarks);
- ``app_context``: the CDK app beside them, read as the CDK CLI reads it and never imported
  (``cdk.json``'s context and command, the synthesized cloud assembly);
- ``build_report``: the table ``build`` and ``demo`` print of a release's models;
- ``capacity_cli``: ``capacity`` (the fleet simulated for every candidate instance type and count,
  ``capacity_report`` writes text, JSON of ``capacity.schema.json`` and markdown);
  ``plan_capacity``: ``plan``'s capacity line.

Owns: everything a user runs against a build, a bucket or an endpoint, on their own machine.
Nothing here is part of the build runtime: the release and model keys do not hash this folder and
the Lambda image does not need it, so editing a tool never rebuilds or republishes a model. Only
the CLI front (``model_build/__main__.py``) imports it.

May import: ``shared``, ``manifest``, ``artifact``, ``release``, ``text_ensemble``, ``capacity``.
"""
