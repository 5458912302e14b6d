"""The price table ``capacity`` costs fleets with: the user's, never fetched.

A YAML (or JSON) file::

    date: 2026-11-27          # when the prices were read (required)
    source: https://aws.amazon.com/sagemaker/pricing/ ...   # where (required)
    verified: false           # whether someone checked them at the source on that date
    currency: USD
    region: us-east-1
    per_hour:                 # instance type -> price of one instance for one hour
      ml.g5.xlarge: 1.408

A table without a date or a source is refused: a cost nobody can trace is no cost. The example
this project ships (``examples/capacity/prices.example.yaml``) says ``verified: false``, and every
report that uses an unverified table says so beside the cost.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_mme_cdk.model_build.capacity.traffic import check_mapping, read_yaml
from triton_mme_cdk.model_build.errors import CapacityInputError

PRICE_KEYS = ("date", "source", "verified", "currency", "region", "per_hour")


@dataclass(frozen=True)
class PriceTable:
    date: str
    source: str
    verified: bool
    currency: str
    region: str
    per_hour: dict[str, float]

    def label(self) -> str:
        """How a cost is qualified wherever it is shown."""
        state = "verified" if self.verified else "UNVERIFIED"
        return f"{self.currency}/h, {state} prices of {self.date} ({self.region}; {self.source})"

    def as_json(self) -> dict[str, Any]:
        return {"date": self.date, "source": self.source, "verified": self.verified, "currency": self.currency,
                "region": self.region}


def parse_prices(data: Any, *, where: str = "prices", known: tuple[str, ...] = ()) -> PriceTable:
    """The table of ``data``; ``known`` (when given) are the instance types a price may name."""
    data = check_mapping(data, where, PRICE_KEYS, ", ".join(PRICE_KEYS))
    texts: dict[str, str] = {}
    for key in ("date", "source"):
        value = data.get(key)
        if isinstance(value, (datetime.date, datetime.datetime)):
            value = value.isoformat()
        if not isinstance(value, str) or not value.strip():
            raise CapacityInputError(f"{where}.{key}: got {value!r}; a price table must say "
                                     + ("when its prices were read (a date such as 2026-11-27)" if key == "date"
                                        else "where its prices come from (a URL or a document)"))
        texts[key] = value.strip()
    verified = data.get("verified", False)
    if not isinstance(verified, bool):
        raise CapacityInputError(f"{where}.verified: got {verified!r}; expected true or false")
    per_hour = data.get("per_hour")
    if not isinstance(per_hour, dict) or not per_hour:
        raise CapacityInputError(f"{where}.per_hour: got {per_hour!r}; expected instance type -> price per hour")
    prices: dict[str, float] = {}
    for name, value in per_hour.items():
        field = f"{where}.per_hour.{name}"
        if known and name not in known:
            raise CapacityInputError(f"{field}: unknown instance type; expected one of {', '.join(known)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise CapacityInputError(f"{field}: got {value!r}; expected a price per hour, a number >= 0")
        prices[str(name)] = float(value)
    return PriceTable(texts["date"], texts["source"], verified, str(data.get("currency", "USD")),
                      str(data.get("region", "unstated")), prices)


def read_prices(path: Path, *, known: tuple[str, ...] = ()) -> PriceTable:
    return parse_prices(read_yaml(path, "--prices"), where=path.name, known=known)
