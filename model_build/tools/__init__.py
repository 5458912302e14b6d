"""Tools users run on their own machine, one folder per product, and what they share.

- ``review/``: the change review. ``plan`` and ``releases`` (``plan_cli``): what a change does to
  the models, the fleet and the data (``plan_verdict`` judges the template with the CDK's diff
  engine, ``cfn_diff.js``; ``plan_security`` and ``plan_access``: who can do what, widened or
  narrowed; ``plan_headline``; ``plan_capacity``: the capacity line; ``plan_report`` writes text,
  JSON of ``plan.schema.json`` and markdown, with the plan's digest); the pull request's gate,
  ``pr-comment`` (``pr_comment``), ``pr-fetch`` (``pr_fetch``: a pull request's synthesized
  template, as untrusted data) and ``pr-gate`` (``pr_gate``: an approval bound to the plan's
  digest), over GitHub's REST API (``github_api``); the delivery pipeline's plan step
  (``pipeline_plan``).
- ``local_endpoint/``: ``endpoint``, a SageMaker multi-model endpoint on this machine (``server``:
  the runtime and control-plane APIs) with SageMaker's part of MME (``model_cache``: loading,
  eviction, out-of-memory retries) over ``served_release`` (what it serves) and ``triton_server``
  (the real ``tritonserver``, in a network namespace of its own where the host allows one:
  ``triton_netns``), with ``triton_backends``.
- ``smoke/``: ``smoke``, every target of a deployed endpoint invoked and checked against the
  release's references (``runner``; ``prepare``: the clients, the release and the references;
  ``cli``; ``codec``: the client side of Triton's binary+JSON protocol).
- ``capacity/``: the front of :mod:`model_build.capacity`. ``capacity`` (``cli``: the fleet
  simulated for every candidate instance type and count; ``report`` writes text, JSON of
  ``capacity.schema.json`` and markdown) and the ``--instance-type`` check of ``validate``,
  ``build`` and ``publish`` (``fit_check``).
- Shared, here: ``app_context`` (the CDK app beside the tools, read as the CDK CLI reads it and
  never imported: ``cdk.json``'s context and command, the synthesized cloud assembly);
  ``doctor_cli`` (``doctor``: the served bucket's invariants checked and repaired,
  :mod:`model_build.release.doctor`); ``build_report`` (the table ``build`` and ``demo`` print of
  a release's models); ``local_s3`` (moto's S3 server on loopback: demo, tests, benchmarks);
  ``text_sources`` (offline text sources of every tokenizer kind: tests, benchmarks).

Owns: everything a user runs against a build, a bucket or an endpoint, on their own machine.
Nothing here is part of the build runtime: the release and model keys do not hash this folder and
the Lambda image does not need it, so editing a tool never rebuilds or republishes a model. Only
the CLI front (``model_build/__main__.py``) imports it.

May import: ``shared``, ``manifest``, ``artifact``, ``release``, ``text_ensemble``, ``capacity``.
"""
