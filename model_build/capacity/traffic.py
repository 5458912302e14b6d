"""The traffic profile of ``python -m model_build capacity``, and the requests drawn from it.

A profile is a YAML (or JSON) file with either per-model rates::

    rates:                    # requests per second of each target model
      minilm-l6-embedding: 20
      resnet-synthetic: 3     # an entry with copies: split evenly over its copies

or a total rate spread by Zipf's law::

    total_rate: 10            # requests per second, all models together (default 10)
    zipf: 1.0                 # exponent s in [0, 4]: the k-th model gets a share 1/k^s (default 1.0)
    order: [minilm-l6-text]   # the most requested first; the rest follow in manifest order

and, with either, ``service_ms`` (target or entry name -> milliseconds of GPU time per request,
over the measurements). Without a file the profile is the defaults: 10 requests per second over
every target, Zipf exponent 1.0, in manifest order. Every bad value is refused before anything
is simulated, in one line that names the field.

The requests are a Poisson stream at the total rate, each request's model drawn by the rates:
``random.Random(seed)``, so a seed gives the same requests on every machine.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.errors import CapacityInputError

DEFAULT_TOTAL_RATE = 10.0
DEFAULT_ZIPF = 1.0
ZIPF_RANGE = (0.0, 4.0)
PROFILE_KEYS = ("rates", "total_rate", "zipf", "order", "service_ms")


@dataclass(frozen=True)
class Traffic:
    """Requests per second of each target model (every target named, zero for none)."""

    rates: dict[str, float]
    #: How the rates were given, for the report ("zipf s=1.0, 10 req/s in total").
    described: str
    #: Milliseconds of GPU time per request that the profile gives (target name -> ms).
    service_ms: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.rates.values())


def check_mapping(data: Any, where: str, keys: Sequence[str], expected: str) -> dict[str, Any]:
    """``data`` as a mapping of only ``keys``; one error line naming ``where`` (and the first
    unknown key) otherwise."""
    if not isinstance(data, dict):
        raise CapacityInputError(f"{where}: got {type(data).__name__}; expected a mapping with {expected}")
    unknown = sorted(set(data) - set(keys))
    if unknown:
        raise CapacityInputError(f"{where}.{unknown[0]}: unknown field; expected one of {', '.join(keys)}")
    return data


def read_yaml(path: Path, option: str) -> Any:
    """The YAML (or JSON) document in the file an option names; one error line otherwise."""
    import yaml

    if not path.is_file():
        raise CapacityInputError(f"{option}: got {str(path)!r}; no such file")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise CapacityInputError(f"{option} {path}: not YAML or JSON ({' '.join(str(error).split())})") from None


def _number(value: Any, field: str, *, low: float = 0.0, high: float = math.inf, expected: str = "") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise CapacityInputError(f"{field}: got {value!r}; expected {expected or 'a number >= 0'}")
    return float(value)


def _expand(name: str, field: str, groups: Mapping[str, Sequence[str]]) -> Sequence[str]:
    """The targets a name stands for: itself, or an entry's copies."""
    if name in groups:
        return groups[name]
    if any(name in targets for targets in groups.values()):
        return [name]
    known = ", ".join(sorted({t for targets in groups.values() for t in targets}))
    raise CapacityInputError(f"{field}: got {name!r}; no such model in the manifest (models: {known})")


def parse_profile(data: Any, groups: Mapping[str, Sequence[str]], *, where: str = "traffic") -> Traffic:
    """The profile of ``data`` (a file's mapping, or None for the defaults) over the manifest's
    targets; ``groups`` maps each entry name to its target names, in manifest order."""
    data = check_mapping({} if data is None else data, where, PROFILE_KEYS, " or ".join(PROFILE_KEYS[:2]))
    targets = [t for names in groups.values() for t in names]
    rates = dict.fromkeys(targets, 0.0)
    if "rates" in data:
        for key in ("total_rate", "zipf", "order"):
            if key in data:
                raise CapacityInputError(f"{where}.{key}: given with {where}.rates; give per-model rates or a "
                                         "total rate with a Zipf exponent, not both")
        given = data["rates"]
        if not isinstance(given, dict) or not given:
            raise CapacityInputError(f"{where}.rates: got {given!r}; expected model name -> requests per second")
        for name, value in given.items():
            field = f"{where}.rates.{name}"
            named = _expand(str(name), field, groups)
            rate = _number(value, field, expected="requests per second, a number >= 0")
            for target in named:
                rates[target] += rate / len(named)
        described = f"per-model rates, {sum(rates.values()):g} req/s in total"
    else:
        total = _number(data.get("total_rate", DEFAULT_TOTAL_RATE), f"{where}.total_rate",
                        expected="requests per second, a number > 0")
        if total <= 0:
            raise CapacityInputError(f"{where}.total_rate: got {data['total_rate']!r}; expected requests per "
                                     "second, a number > 0")
        s = _number(data.get("zipf", DEFAULT_ZIPF), f"{where}.zipf", low=ZIPF_RANGE[0], high=ZIPF_RANGE[1],
                    expected=f"a Zipf exponent in [{ZIPF_RANGE[0]:g}, {ZIPF_RANGE[1]:g}]")
        order = data.get("order", [])
        if not isinstance(order, list):
            raise CapacityInputError(f"{where}.order: got {order!r}; expected a list of model names")
        ranked: list[str] = []
        for position, name in enumerate(order):
            ranked += [t for t in _expand(str(name), f"{where}.order[{position}]", groups) if t not in ranked]
        ranked += [t for t in targets if t not in ranked]
        weights = [1.0 / (k ** s) for k in range(1, len(ranked) + 1)]
        norm = sum(weights)
        rates = {t: total * w / norm for t, w in zip(ranked, weights, strict=True)}
        described = f"Zipf s={s:g} over {len(ranked)} models, {total:g} req/s in total"
    service: dict[str, float] = {}
    given_ms = data.get("service_ms", {})
    if not isinstance(given_ms, dict):
        raise CapacityInputError(f"{where}.service_ms: got {given_ms!r}; expected model name -> milliseconds")
    for name, value in given_ms.items():
        field = f"{where}.service_ms.{name}"
        ms = _number(value, field, expected="milliseconds per request, a number > 0")
        if ms <= 0:
            raise CapacityInputError(f"{field}: got {value!r}; expected milliseconds per request, a number > 0")
        for target in _expand(str(name), field, groups):
            service[target] = ms
    if sum(rates.values()) <= 0:
        raise CapacityInputError(f"{where}.rates: every rate is 0; expected at least one model with requests")
    return Traffic(rates, described, service)


def read_profile(path: Path | None, groups: Mapping[str, Sequence[str]]) -> Traffic:
    """The profile in the file at ``path`` (YAML or JSON), or the defaults for None."""
    if path is None:
        return parse_profile(None, groups)
    return parse_profile(read_yaml(path, "--traffic"), groups, where=path.name)


def draw_requests(rates: Sequence[float], *, seconds: float, seed: int) -> tuple[list[float], list[int]]:
    """A Poisson stream of ``seconds`` at ``sum(rates)`` per second: the arrival times and, for
    each, the index of its model (drawn in proportion to ``rates``)."""
    total = sum(rates)
    if total <= 0 or seconds <= 0:
        return [], []
    rng = random.Random(seed)
    cumulative: list[float] = []
    running = 0.0
    for rate in rates:
        running += rate
        cumulative.append(running)
    times: list[float] = []
    t = rng.expovariate(total)
    expovariate, append = rng.expovariate, times.append
    while t < seconds:
        append(t)
        t += expovariate(total)
    picks = rng.random
    last = len(rates) - 1
    targets = [min(bisect.bisect_right(cumulative, picks() * running), last) for _ in times]
    return times, targets
