"""``/metrics`` of the Ray application: every replica's page, labelled, and their sum.

Each replica serves aserve's own Prometheus page (``aserve/server/metrics.py``). The ingress
fetches all of them and writes one page: every sample once per replica with a ``replica``
label, and once without it, summed over the replicas: the cluster's view, under the same
names a single server uses (so ``loadgen`` reads it unchanged). Two gauges are ratios and are
recomputed from the summed counts rather than summed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

_RATIOS = {
    "aserve_kv_usage_ratio": ("aserve_kv_used_tokens", "aserve_kv_total_tokens"),
    "aserve_prefix_cache_hit_rate": (
        "aserve_prefix_cache_hit_tokens_total",
        "aserve_prefix_cache_queried_tokens_total",
    ),
}


@dataclass
class _Family:
    name: str
    kind: str
    doc: str
    per_replica: list[str] = field(default_factory=list)
    total: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    text = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return "{" + text + "}" if text else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return repr(float(value)) if value == value else "NaN"


def aggregate(pages: Sequence[tuple[str, str]]) -> str:
    """``pages``: (replica id, its exposition text). Returns one exposition text."""
    families: dict[str, _Family] = {}
    plain: dict[str, float] = {}  # unlabelled sample name -> sum, for the ratios
    for replica, text in pages:
        for parsed in text_string_to_metric_families(text):
            out = families.setdefault(parsed.name, _Family(parsed.name, parsed.type, parsed.documentation))
            for s in parsed.samples:
                if s.name.endswith("_created"):  # a start time: per process, meaningless summed
                    continue
                labels = tuple(sorted(s.labels.items()))
                out.per_replica.append(f"{s.name}{_labels((*labels, ('replica', replica)))} {_number(s.value)}")
                key = (s.name, labels)
                out.total[key] = out.total.get(key, 0.0) + s.value
                if not labels:
                    plain[s.name] = plain.get(s.name, 0.0) + s.value
    lines: list[str] = []
    for fam in families.values():
        lines.append(f"# HELP {fam.name} {fam.doc}")
        lines.append(f"# TYPE {fam.name} {fam.kind}")
        for (name, labels), value in fam.total.items():
            if name in _RATIOS:
                num, den = (plain.get(n, 0.0) for n in _RATIOS[name])
                value = num / den if den else 0.0
            lines.append(f"{name}{_labels(labels)} {_number(value)}")
        lines.extend(fam.per_replica)
    lines.append("# HELP aserve_replicas Engine replicas whose metrics this page holds")
    lines.append("# TYPE aserve_replicas gauge")
    lines.append(f"aserve_replicas {len(pages)}.0")
    return "\n".join(lines) + "\n"
