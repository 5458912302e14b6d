"""Lambda handlers of the stack's model-build custom resource (the CDK ``Provider`` contract) and
of its build state machine.

Builds are incremental and content-addressed (see :mod:`model_build.release.identity`): each model has a
key; a built model is stored once under ``<prefix>/_builds/<key>/``; a release is assembled from
the store by server-side copies, its index written last. A release prefix stays immutable.

- ``on_event`` checks the request and the manifest in seconds and names the physical resource
  after the fixed served prefix (``s3://<bucket>/<prefix>/served/``, the endpoint's
  ``ModelDataUrl``): a new release is an Update of the same resource, never a replacement, so
  CloudFormation sends no clean-up Delete that could remove what the live fleet serves. With a
  ``BuildStateMachineArn`` property it starts the build state machine (unless the release index
  already exists: a rollback, or an unchanged release, builds nothing).
- ``build_step`` is the state machine's build function, under the build role (it writes only
  ``_builds/``, ``_plans/`` and ``_jobs/``): ``plan`` writes the Map's item source (the models
  whose key is not stored), ``build`` builds and stores one model (one Lambda run each, in
  parallel). A failing model records its name and reason under ``<prefix>/_plans/`` and fails
  its Map item; ``plan`` resets that record to a "no failure" marker (a put, not a delete: the
  build role may not delete).
- ``place_step`` is the state machine's Finish task, under the placing role (the role of
  ``on_event`` and ``is_complete``): it reads each stored tarball it is about to place, checks
  its SHA-256 and runs the pre-publish gate on it again, then assembles the release (server-side
  copies whose S3 checksum must be that digest) and writes its index.
- ``is_complete`` polls: the release index exists -> route it (:func:`model_build.release.
  serving.activate_release`: check the newly routed objects, delete the expired unrouted ones, write the
  routes document last) -> done; the execution runs -> not yet; the execution failed -> the
  failing model's reason, which CloudFormation shows (the previous routes keep serving). Without a state
  machine it builds as many models per run as fit, across several calls (the same per-model
  unit and final step). Nothing is kept in ``/tmp`` between calls.

Failures reach CloudFormation as a short reason naming the model and the step.

The template names the four entry points by dotted path (``model_build.handler.on_event``,
``model_build.handler.is_complete``, ``model_build.handler.build_step``,
``model_build.handler.place_step``): they are re-exported here, and their modules are
``request`` (the request and the manifest asset, checked), ``custom_resource`` (``on_event``,
``is_complete``), ``build_steps`` (``build_step``, and the failure record ``is_complete`` reads)
and ``place`` (``place_step``); ``units`` is the work both build paths do (this runtime's
keys, one model built and stored, the release assembled from the store).

Owns: the Lambda side of the deploy. It composes the build and the release; nothing imports it.

May import: ``shared``, ``manifest``, ``artifact`` (the pre-publish gate a Processing job's tarball passes again), ``pipeline``, ``release``, ``capacity``, ``text_ensemble.serving_wheel`` (the pinned wheel's files a raw-text tarball must carry).
"""

from triton_mme_cdk.model_build.handler.build_steps import build_item, build_step, plan_items
from triton_mme_cdk.model_build.handler.custom_resource import is_complete, on_event
from triton_mme_cdk.model_build.handler.place import finish_release, place_step
from triton_mme_cdk.model_build.handler.request import HandlerError, Request, request_type

__all__ = [
    "HandlerError",
    "Request",
    "build_item",
    "build_step",
    "finish_release",
    "is_complete",
    "on_event",
    "place_step",
    "plan_items",
    "request_type",
]
