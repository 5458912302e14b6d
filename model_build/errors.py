"""Typed errors for the model build.

Every error a user can cause carries enough context to act on without a stack trace: the CLI,
the CDK app and the Lambda handler print ``str(error)`` and nothing else for these.
"""

from __future__ import annotations


class ModelBuildError(Exception):
    """Base class: an expected failure, reported as one message without a traceback.

    ``step`` and ``model`` let the Lambda handler give CloudFormation a short reason that names
    what failed and where.
    """

    step: str = "build"

    def __init__(self, message: str, *, model: str | None = None, step: str | None = None) -> None:
        super().__init__(message)
        self.model = model
        if step is not None:
            self.step = step

    def short_reason(self, limit: int = 400) -> str:
        """One line for CloudFormation's status reason, which is cut at about 4 KB."""
        where = f"{self.step} of model {self.model!r}" if self.model else self.step
        text = " ".join(str(self).split())
        reason = f"{where} failed: {text}"
        return reason if len(reason) <= limit else reason[: limit - 3] + "..."


class ManifestError(ModelBuildError):
    """The manifest (or a setting) cannot give a loadable model; raised before any slow work."""

    step = "manifest validation"


class SourceError(ModelBuildError):
    """A model source cannot be resolved or read (a path, S3 object or package that is missing,
    or a file that is not a model); raised before any export."""

    step = "source"


class ExportError(ModelBuildError):
    """The ONNX export or TorchScript trace failed, or gave a graph unlike the manifest's
    declaration (its inputs, outputs or a shape-dependent trace)."""

    step = "export"


class ValidationMismatchError(ModelBuildError):
    """Exported outputs differ from the reference beyond the model's tolerance (or are not finite)."""

    step = "validation"

    def __init__(
        self,
        message: str,
        *,
        model: str,
        output: str,
        max_abs_diff: float,
        tolerance: float | None = None,
    ) -> None:
        super().__init__(message, model=model)
        self.output = output
        self.max_abs_diff = max_abs_diff
        self.tolerance = tolerance


class TritonConfigError(ModelBuildError):
    """A generated ``config.pbtxt`` would not load in Triton."""

    step = "triton config"


class PackageError(ModelBuildError):
    """The model repository cannot become a tarball Triton loads (its layout, a file type, a size)."""

    step = "package"


class TokenizerCheckError(PackageError):
    """A raw-text target's tokenizer cannot serve its model: no tokenizer file, one that does not
    load, a pad token outside its vocabulary, or ordinary text encoded to no token. Raised by the
    served tokenizer step before the export (and by the ensemble check after it), naming the
    source and the file."""

    step = "tokenizer"


class PublishError(ModelBuildError):
    """An S3 write, copy or listing of a release failed, or a release would be incomplete; no
    index is written then, so a re-run finishes what is missing."""

    step = "publish"


class VerifyError(ModelBuildError):
    """A published target does not answer as its reference recorded, or the reference itself
    cannot be read (verify, smoke, the local endpoint)."""

    step = "verify"


class AccuracyGateError(ModelBuildError):
    """An optimized or lower-precision variant misses an accuracy gate against PyTorch FP32.

    ``metric`` is ``min_cosine`` or ``top_k_agreement``; ``value`` what was measured and ``gate``
    the lowest value allowed, so a user sees at once how far off the variant is.
    """

    step = "validation"

    def __init__(
        self, message: str, *, model: str, metric: str, value: float, gate: float, precision: str
    ) -> None:
        super().__init__(message, model=model)
        self.metric = metric
        self.value = value
        self.gate = gate
        self.precision = precision


class CapacityInputError(ModelBuildError):
    """A traffic profile, price table or capacity option that cannot be used
    (``python -m model_build capacity``, ``plan --traffic``)."""

    step = "capacity"


class FitError(ModelBuildError):
    """A model does not fit the fleet's GPU (``model_build.capacity.fit``): its estimate is above the
    usable GPU memory of the instance type. Raised before anything is published."""

    step = "fit check"
