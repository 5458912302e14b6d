"""Which prebuilt TensorRT plans a fleet can load: the check the CDK app runs at synth.

A plan (``format: tensorrt_plan``) is an engine built for one GPU compute capability with one
TensorRT version. Triton picks the file of the GPU it runs on from ``cc_model_filenames``; with no
entry for that GPU, or an engine built by another TensorRT, the model fails to load on its first
invocation, on the fleet, as a 5xx to a client. :func:`tensorrt_plan_problem` finds both at synth,
from the manifest and the fleet's settings alone (``model_build.gpu_hosts``: the GPU of an
instance type, the TensorRT of a Triton image).

Standard library, the manifest and ``gpu_hosts`` only: the app imports it at synth.
"""

from __future__ import annotations

from triton_mme_cdk.model_build.gpu_hosts import gpu_of, triton_release, version_tuple
from triton_mme_cdk.model_build.manifest import Manifest


def _same_tensorrt(built: str, image: str) -> bool:
    """Equal on major.minor.patch: a build number (``10.9.0.34``) does not change the engine format."""
    return version_tuple(built)[:3] == version_tuple(image)[:3]


def tensorrt_plan_problem(manifest: Manifest, *, instance_type: str, image_version: str) -> str | None:
    """One line naming the first plan entry the fleet cannot load, or ``None`` when every plan fits.

    For each ``format: tensorrt_plan`` entry: a plan must be given for the compute capability of
    ``instance_type``'s GPU, and ``tensorrt_version`` must equal (major.minor.patch) the TensorRT
    of Triton image ``image_version``. Where a table does not know the instance family or the
    image, the line says the plans cannot be checked (unknown is never reported as fine). A
    manifest without plans gives ``None`` without reading the tables.
    """
    for index, spec in enumerate(manifest.models):
        plan = spec.tensorrt_plan
        if spec.format != "tensorrt_plan" or plan is None:
            continue
        where = f"models[{index}] {spec.name!r} tensorrt_plan"
        try:
            gpu = gpu_of(instance_type)
        except KeyError as error:
            return (f"{where}.cc_model_filenames: cannot be checked for mme:instance_type {instance_type!r}: "
                    f"{error.args[0]}; add its GPU to model_build/gpu_hosts.py INSTANCE_GPUS, or choose a known "
                    "instance family")
        cc = gpu.compute_capability
        if cc not in plan.cc_model_filenames:
            given = ", ".join(plan.cc_model_filenames)
            short = gpu.name.removeprefix("NVIDIA ")
            article = "an" if short[:1] in set("AEFHILMNORSX") else "a"  # as the letter is spoken
            return (f"{where}.cc_model_filenames: the fleet's {instance_type} has an {gpu.name}, compute "
                    f"capability {cc}; plans are given for {given}: build the plan on {article} {short} and add it under "
                    f"\"{cc}\", or change mme:instance_type")
        try:
            image_tensorrt = triton_release(image_version).tensorrt
        except KeyError as error:
            return (f"{where}.tensorrt_version: {plan.tensorrt_version!r} cannot be checked for "
                    f"mme:triton_image_version {image_version!r}: {error.args[0]}; add the image's row to "
                    "model_build/gpu_hosts.py TRITON_RELEASES, or choose a known image version")
        if image_tensorrt is None:
            continue  # not confirmed at a source: tensorrt_plan_unchecked says so, never a refusal
        if not _same_tensorrt(plan.tensorrt_version, image_tensorrt):
            return (f"{where}.tensorrt_version: got {plan.tensorrt_version!r}; Triton image {image_version} has "
                    f"TensorRT {image_tensorrt}, and a plan loads only with the TensorRT that built it: rebuild the "
                    f"plans with TensorRT {image_tensorrt} (the {image_version} NGC TensorRT container), or choose "
                    f"the mme:triton_image_version whose TensorRT is {plan.tensorrt_version}")
    return None


def tensorrt_plan_unchecked(manifest: Manifest, *, image_version: str) -> str | None:
    """One line when the manifest has plans but the TensorRT of Triton image ``image_version`` is not
    confirmed in ``model_build.gpu_hosts`` (so :func:`tensorrt_plan_problem` could not compare the
    versions), for synth to warn about; ``None`` otherwise."""
    plans = [spec for spec in manifest.models if spec.format == "tensorrt_plan" and spec.tensorrt_plan is not None]
    if not plans:
        return None
    try:
        image_tensorrt = triton_release(image_version).tensorrt
    except KeyError:
        return None  # tensorrt_plan_problem refuses an image the table does not know
    if image_tensorrt is not None:
        return None
    declared = ", ".join(sorted({f"{spec.name} {spec.tensorrt_plan.tensorrt_version}" for spec in plans
                                 if spec.tensorrt_plan is not None}))
    return (f"the TensorRT of Triton image {image_version} is not confirmed in model_build/gpu_hosts.py, so the "
            f"plans' TensorRT versions ({declared}) are not checked against it; a plan built with another "
            "TensorRT fails to load on the fleet ('engine plan file is not compatible'). Check the image's "
            "TensorRT in NVIDIA's Frameworks Support Matrix")
