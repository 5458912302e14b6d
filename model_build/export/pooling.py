"""Sentence embeddings inside the exported graph, pooled the way the source's own config says.

A sentence-transformers folder says how its embedding is made: ``modules.json`` lists the
modules (Transformer, Pooling, Normalize ...) and ``1_Pooling/config.json`` the pooling mode(s).
The graph follows it, so the endpoint answers what ``SentenceTransformer.encode`` answers for the
same texts (the build checks that, with the model's tolerance). Supported, as sentence-transformers
computes them: the pooling modes ``cls``, ``max``, ``mean``, ``mean_sqrt_len_tokens``,
``weightedmean`` and ``lasttoken`` (several are concatenated in the order given), then ``Normalize``
when the folder has it. A source without ``modules.json`` gets mean pooling and L2 normalisation.

Refused, with the module named: any other module (``Dense``, ``LayerNorm``, ``CNN``, ``LSTM``,
``WordEmbeddings``, ``Router``/``Asym`` ...: the graph would silently differ from the reference);
a ``default_prompt_name`` (sentence-transformers prepends that prompt to every text, the
endpoint's clients would not). The Pooling's ``include_prompt`` has no effect: the ensemble adds
no prompt.

The config is read by sentence-transformers' own loader (``Pooling.load``), which also reads the
older ``pooling_mode_*_tokens`` keys, so both formats mean what they mean to the library.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from triton_mme_cdk.model_build.errors import SourceError

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
#: modules.json module class names (the last part of ``type``; its package path moved between
#: sentence-transformers versions) the graph reproduces.
SUPPORTED_MODULES = ("Transformer", "Pooling", "Normalize")
MODULES_FILE = "modules.json"
ST_CONFIG_FILE = "config_sentence_transformers.json"


@dataclass(frozen=True)
class PoolingConfig:
    """How token embeddings become the sentence embedding."""

    modes: tuple[str, ...] = ("mean",)
    normalize: bool = True
    #: Read from the source's ``modules.json`` (then sentence-transformers' own pipeline is the
    #: reference as it stands; without it the reference is asked to normalise like the default).
    from_modules: bool = False

    def describe(self) -> str:
        return "+".join(self.modes) + (" pooling, L2-normalized" if self.normalize else " pooling")


DEFAULT_POOLING = PoolingConfig()


def _fail(model: str, where: Path, message: str) -> SourceError:
    return SourceError(f"source: {where}: {message}", model=model)


def pooling_config(source_dir: Path | None, model: str) -> PoolingConfig:
    """The source's pooling (module docstring); :data:`DEFAULT_POOLING` without ``modules.json``."""
    if source_dir is None or not (source_dir / MODULES_FILE).is_file():
        return DEFAULT_POOLING
    path = source_dir / MODULES_FILE
    try:
        modules = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise _fail(model, path, f"cannot read it as JSON ({error})") from None
    if not isinstance(modules, list) or not all(isinstance(m, dict) and isinstance(m.get("type"), str)
                                                for m in modules):
        raise _fail(model, path, "expected a list of modules, each with a 'type'")
    kinds = [str(m["type"]).rsplit(".", 1)[-1] for m in modules]
    for index, (module, kind) in enumerate(zip(modules, kinds, strict=True)):
        if kind not in SUPPORTED_MODULES:
            raise _fail(model, path, f"module {index} is {module['type']}; the exported graph reproduces "
                        f"{', '.join(SUPPORTED_MODULES)} only, so the endpoint would not answer what "
                        "SentenceTransformer.encode answers: export a model without it, or serve token outputs "
                        "(task feature-extraction) and apply it in the client")
    if kinds[:2] != ["Transformer", "Pooling"] or kinds[2:] not in ([], ["Normalize"]):
        raise _fail(model, path, f"modules {kinds}; supported: Transformer, Pooling, then Normalize or nothing")
    _check_prompt(source_dir, model)
    from sentence_transformers.sentence_transformer.modules import Pooling

    pooling_path = source_dir / str(modules[1].get("path", ""))
    try:
        pooling = Pooling.load(str(pooling_path))
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise _fail(model, pooling_path, f"sentence-transformers cannot load the Pooling config ({error})") from None
    modes = (pooling.pooling_mode,) if isinstance(pooling.pooling_mode, str) else tuple(pooling.pooling_mode)
    unknown = [mode for mode in modes if mode not in POOLING_MODES]
    if unknown:
        raise _fail(model, pooling_path, f"pooling mode(s) {unknown}; supported: {', '.join(POOLING_MODES)}")
    return PoolingConfig(modes=modes, normalize=kinds[2:] == ["Normalize"], from_modules=True)


def _check_prompt(source_dir: Path, model: str) -> None:
    path = source_dir / ST_CONFIG_FILE
    if not path.is_file():
        return
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise _fail(model, path, f"cannot read it as JSON ({error})") from None
    prompt = config.get("default_prompt_name") if isinstance(config, dict) else None
    if prompt:
        raise _fail(model, path, f"default_prompt_name is {prompt!r}; sentence-transformers prepends that prompt to "
                    "every text and the endpoint does not: clear default_prompt_name and let clients send the "
                    "prompt as part of their text")


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, modes: tuple[str, ...]) -> torch.Tensor:
    """``[batch, sequence, hidden]`` -> ``[batch, hidden * len(modes)]``, as sentence-transformers'
    ``Pooling`` computes each mode on a padded batch."""
    outputs: list[torch.Tensor] = []
    _, length, width = hidden.shape
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    for mode in modes:
        if mode == "cls":
            first = attention_mask.to(torch.int32).argmax(dim=1)
            outputs.append(torch.gather(hidden, 1, first.view(-1, 1, 1).expand(-1, 1, width)).squeeze(1))
        elif mode == "max":
            outputs.append(hidden.masked_fill(mask.expand_as(hidden) == 0, float("-inf")).max(dim=1).values)
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            counts = mask.sum(dim=1).clamp(min=1e-9)
            outputs.append((hidden * mask).sum(dim=1) / (counts if mode == "mean" else torch.sqrt(counts)))
        elif mode == "weightedmean":
            weights = torch.arange(1, length + 1, dtype=hidden.dtype, device=hidden.device).view(1, -1, 1)
            weights = weights - attention_mask.to(torch.int32).argmax(dim=1).to(hidden.dtype).view(-1, 1, 1)
            weighted = mask * weights
            outputs.append((hidden * weighted).sum(dim=1) / weighted.sum(dim=1).clamp(min=1e-9))
        elif mode == "lasttoken":
            values, indices = attention_mask.to(torch.int32).flip(1).max(1)
            indices = torch.where(values == 0, length - 1, indices)
            last = (length - indices - 1).view(-1, 1, 1).expand(-1, 1, width)
            outputs.append(torch.gather(hidden * mask, 1, last).squeeze(1))
        else:  # pooling_config refuses these first
            raise ValueError(f"pooling mode {mode!r}; supported: {', '.join(POOLING_MODES)}")
    return torch.cat(outputs, dim=-1) if len(outputs) > 1 else outputs[0]


class SentenceEmbedding(nn.Module):
    """Encoder + pooling (+ L2 normalisation), all inside one graph.

    With pooling in the graph Triton returns the embedding itself; clients need no post-processing
    and cannot get it subtly wrong (padding tokens must not count in the mean). Keyword calls:
    transformers 5 no longer takes ``attention_mask`` positionally.
    """

    def __init__(self, encoder: nn.Module, pooling: PoolingConfig = DEFAULT_POOLING) -> None:
        super().__init__()
        self.encoder = encoder
        self.modes = pooling.modes
        self.normalize = pooling.normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        pooled = pool(hidden, attention_mask, self.modes)
        return nn.functional.normalize(pooled, p=2.0, dim=1) if self.normalize else pooled
