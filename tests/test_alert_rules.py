"""Alert rules and the Grafana dashboard only use metrics the supervisor exports.

`promtool check rules` proves the rules parse; `promtool test rules` runs
each alert against synthetic series so a typo in a label or a wrong
aggregation shows up as an alert that does not fire (or fires twice). Metric
names are taken from a live :class:`supervisor.metrics.Metrics` registry,
so renaming a metric without updating the rules or the dashboard fails here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from forq.supervisor.observe.metrics import Metrics

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "etc" / "prometheus" / "forq-alerts.yml"
DASHBOARD = ROOT / "etc" / "grafana" / "forq.json"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is required in CI but not installed")
        pytest.skip("promtool not installed (set CI=1 to make this a failure)")
    return path


def exported_names() -> set[str]:
    """Every sample name a supervisor's /metrics can contain."""
    m = Metrics(lambda: {"q": {"pending": 1, "scheduled": 0, "active": 0, "dead": 0}})
    m.declare_queue("q", 1)
    m.job_started("q", "t", 0.1)
    m.job_finished("q", "t", "succeeded", 1.0, 1024)
    m.lease_extended(1)
    m.reclaimed("q", 1)
    m.redis_error("claim")
    m.shard_state("10.0.0.2:7001", True)
    m.set_tripped("q", ["t"])
    names = set()
    for family in text_string_to_metric_families(m.render().decode()):
        names.add(family.name)
        names.update(s.name for s in family.samples)
    return names


# -- PromQL metric-name extraction ------------------------------------------

_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "and", "or", "unless", "offset", "inf", "nan", "atan2",
}


def metric_names(expr: str) -> set[str]:
    """Metric names referenced by a PromQL expression (a conservative lexer).

    Removes strings, label matchers, ranges, grouping clauses and Grafana
    variables; what remains that is an identifier not followed by "(" is a
    metric name.
    """
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\$\{[^}]*\}|\$\w+", "", e)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    # "max by (queue) (x)" -> "max  (x)": the aggregator then reads as a call.
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)(\s*\()?", e):
        token, call = match.group(1), match.group(2)
        if call or token in _KEYWORDS:
            continue
        names.add(token)
    return names


def test_metric_name_lexer() -> None:
    assert metric_names(
        'histogram_quantile(0.99, sum by (queue, le) (rate(forq_job_wait_seconds_bucket'
        '{queue=~"$queue", le!="x"}[$__rate_interval])))'
    ) == {"forq_job_wait_seconds_bucket"}
    assert metric_names(
        "(up == 0) and on (job, instance) (max_over_time(forq_supervisor_info[1h]) == 1)"
    ) == {"up", "forq_supervisor_info"}
    assert metric_names("a / clamp_min(b, 1e-9) > 0.05 unless on(q) c offset 5m") == {"a", "b", "c"}
    assert metric_names("max by (queue) (x) and sum(y) without (i) > bool 2") == {"x", "y"}


# -- alert rules ------------------------------------------------------------


def rule_exprs() -> dict[str, str]:
    """``alert name -> expr`` parsed from the rules file (no YAML library needed)."""
    text = RULES.read_text()
    out: dict[str, str] = {}
    blocks = re.split(r"^\s*- alert:\s*", text, flags=re.M)[1:]
    for block in blocks:
        name, _, rest = block.partition("\n")
        m = re.search(r"^(\s*)expr:\s*(\|)?(.*)$", rest, flags=re.M)
        assert m, f"no expr for {name}"
        if m.group(2):
            indent = None
            lines = []
            for line in rest[m.end():].splitlines()[1:]:
                if not line.strip():
                    continue
                lead = len(line) - len(line.lstrip())
                if indent is None:
                    indent = lead
                if lead < indent:
                    break
                lines.append(line.strip())
            expr = " ".join(lines)
        else:
            expr = m.group(3).strip()
        out[name.strip()] = expr
    return out


def test_promtool_check_rules() -> None:
    proc = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rule_exprs())} rules found" in proc.stdout


def test_rules_cover_the_agreed_alerts_and_use_exported_metrics() -> None:
    exprs = rule_exprs()
    assert {
        "ForqSupervisorsAbsent",
        "ForqSupervisorDown",
        "ForqDeadJobsGrowing",
        "ForqReclaimsSpiking",
        "ForqBacklogGrowing",
        "ForqQueueWaitHigh",
        "ForqTaskTripped",
    } <= set(exprs)
    known = exported_names() | {"up"}  # `up` is Prometheus' own per-target metric
    for name, expr in exprs.items():
        used = metric_names(expr)
        assert used, f"{name}: no metric found in {expr!r}"
        assert used <= known, f"{name}: unknown metrics {used - known}"
    text = RULES.read_text()
    assert text.count("summary:") == len(exprs)
    assert text.count("description:") == len(exprs)


def strip_annotations(text: str) -> str:
    """Drop annotation blocks so unit tests can compare labels only."""
    out, skip_indent = [], None
    for line in text.splitlines():
        lead = len(line) - len(line.lstrip())
        if skip_indent is not None:
            if not line.strip() or lead > skip_indent:
                continue
            skip_indent = None
        if line.strip() == "annotations:":
            skip_indent = lead
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def S(series: str, values: str) -> dict[str, str]:
    return {"series": series, "values": values}


def A(alert: str, at: str, *labels: dict[str, str]) -> dict[str, object]:
    return {
        "eval_time": at,
        "alertname": alert,
        "exp_alerts": [{"exp_labels": lab} for lab in labels],
    }


# Two supervisors ("a", "b") serve the same queues, as in production.
SUP = {"a": 'job="forq",instance="a:9464"', "b": 'job="forq",instance="b:9464"'}

UNIT_TESTS = [
    {
        "interval": "1m",
        "input_series": [
            # images/resize tripped from minute 10 to 20, seen by both supervisors; the
            # series is gone (not 0) once it is resumed
            S(f'forq_task_tripped{{{SUP["a"]},queue="images",task="resize"}}',
              "_x10 1x10 stale"),
            S(f'forq_task_tripped{{{SUP["b"]},queue="images",task="resize"}}',
              "_x10 1x10 stale"),
        ],
        "alert_rule_test": [
            A("ForqTaskTripped", "5m"),
            A("ForqTaskTripped", "15m",
              {"severity": "warning", "queue": "images", "task": "resize"}),
            A("ForqTaskTripped", "30m"),
        ],
    },
    {
        "interval": "1m",
        "input_series": [
            # emails: dead set grows from 0 to 2 at minute 20, seen by both supervisors.
            S(f'forq_queue_jobs{{{SUP["a"]},queue="emails",state="dead"}}', "0x19 2x20"),
            S(f'forq_queue_jobs{{{SUP["b"]},queue="emails",state="dead"}}', "0x19 2x20"),
            # reports: 3 of 5 dead jobs requeued. increase() would call the
            # drop a counter reset and report 2 "new" dead jobs; delta() does not.
            S(f'forq_queue_jobs{{{SUP["a"]},queue="reports",state="dead"}}', "5x19 2x20"),
            # jobs: the supervisor dead-letters one at minute 30 while an operator
            # requeues two, so the set shrinks; the outcome counter still alerts.
            S(f'forq_queue_jobs{{{SUP["a"]},queue="jobs",state="dead"}}', "3x29 2x10"),
            S(f'forq_jobs_finished_total{{{SUP["a"]},queue="jobs",task="t",outcome="dead"}}',
              "0x29 1x10"),
            S(f'forq_slots{{{SUP["a"]},queue="emails"}}', "2x40"),
            S(f'forq_supervisor_info{{{SUP["a"]},name="forq",version="0.1.0"}}', "1x40"),
        ],
        "alert_rule_test": [
            A("ForqDeadJobsGrowing", "10m"),
            A("ForqDeadJobsGrowing", "25m", {"severity": "warning", "queue": "emails"}),
            A("ForqDeadJobsGrowing", "35m", {"severity": "warning", "queue": "jobs"}),
            A("ForqDeadJobsGrowing", "50m"),
            A("ForqSupervisorsAbsent", "30m"),
        ],
    },
    {
        "interval": "1m",
        # Nothing forq-ish exported at all: only some other target.
        "input_series": [S('up{job="node",instance="n:9100"}', "1x20")],
        "alert_rule_test": [
            A("ForqSupervisorsAbsent", "3m"),
            A("ForqSupervisorsAbsent", "10m", {"severity": "critical"}),
        ],
    },
    {
        "interval": "1m",
        "input_series": [
            # Supervisor a dies at minute 10; b and an unrelated target stay up.
            S(f'up{{{SUP["a"]}}}', "1x9 0x20"),
            S(f'forq_supervisor_info{{{SUP["a"]},name="forq",version="0.1.0"}}', "1x9 stale"),
            S(f'up{{{SUP["b"]}}}', "1x30"),
            S(f'forq_supervisor_info{{{SUP["b"]},name="forq",version="0.1.0"}}', "1x30"),
            S('up{job="node",instance="n:9100"}', "0x30"),
        ],
        "alert_rule_test": [
            A("ForqSupervisorDown", "12m"),
            A("ForqSupervisorDown", "20m",
              {"severity": "warning", "job": "forq", "instance": "a:9464"}),
        ],
    },
    {
        "interval": "1m",
        "input_series": [
            # 12 reclaims a minute (0.2/s), split over two supervisors' reapers.
            S(f'forq_reclaimed_total{{{SUP["a"]},queue="emails"}}', "0+6x40"),
            S(f'forq_reclaimed_total{{{SUP["b"]},queue="emails"}}', "0+6x40"),
            # One reclaim every 10 minutes is normal life.
            S(f'forq_reclaimed_total{{{SUP["a"]},queue="reports"}}', "0+0.1x40"),
        ],
        "alert_rule_test": [
            A("ForqReclaimsSpiking", "8m"),
            A("ForqReclaimsSpiking", "25m", {"severity": "warning", "queue": "emails"}),
        ],
    },
    {
        "interval": "1m",
        "input_series": [
            # emails: every claimed job waited between 5 and 15 minutes.
            S(f'forq_job_wait_seconds_bucket{{{SUP["a"]},queue="emails",le="300.0"}}', "0x60"),
            S(f'forq_job_wait_seconds_bucket{{{SUP["a"]},queue="emails",le="900.0"}}', "0+10x60"),
            S(f'forq_job_wait_seconds_bucket{{{SUP["a"]},queue="emails",le="+Inf"}}', "0+10x60"),
            # reports: claimed within 10 ms.
            S(f'forq_job_wait_seconds_bucket{{{SUP["a"]},queue="reports",le="0.01"}}', "0+10x60"),
            S(f'forq_job_wait_seconds_bucket{{{SUP["a"]},queue="reports",le="300.0"}}', "0+10x60"),
            S(f'forq_job_wait_seconds_bucket{{{SUP["a"]},queue="reports",le="900.0"}}', "0+10x60"),
            S(f'forq_job_wait_seconds_bucket{{{SUP["a"]},queue="reports",le="+Inf"}}', "0+10x60"),
        ],
        "alert_rule_test": [
            A("ForqQueueWaitHigh", "10m"),
            A("ForqQueueWaitHigh", "40m", {"severity": "warning", "queue": "emails"}),
        ],
    },
    {
        "interval": "1m",
        "input_series": [
            # emails: 5 pending, nothing started for the whole window.
            S(f'forq_queue_jobs{{{SUP["a"]},queue="emails",state="pending"}}', "5x60"),
            S(f'forq_jobs_started_total{{{SUP["a"]},queue="emails",task="send"}}', "3x60"),
            # reports: pending but being worked on.
            S(f'forq_queue_jobs{{{SUP["a"]},queue="reports",state="pending"}}', "5x60"),
            S(f'forq_jobs_started_total{{{SUP["a"]},queue="reports",task="build"}}', "0+2x60"),
            # slow: pending, and no series at all for started jobs (never served).
            S(f'forq_queue_jobs{{{SUP["a"]},queue="orphan",state="pending"}}', "1x60"),
            # bulk: a backlog of 200 growing by 10 a minute.
            S(f'forq_queue_jobs{{{SUP["a"]},queue="bulk",state="pending"}}', "200+10x90"),
            S(f'forq_jobs_started_total{{{SUP["a"]},queue="bulk",task="x"}}', "0+5x90"),
        ],
        "alert_rule_test": [
            A("ForqQueueStalled", "40m",
              {"severity": "critical", "queue": "emails"},
              {"severity": "critical", "queue": "orphan"}),
            A("ForqBacklogGrowing", "20m"),
            A("ForqBacklogGrowing", "80m", {"severity": "warning", "queue": "bulk"}),
        ],
    },
    {
        "interval": "1m",
        "input_series": [
            S(f'forq_redis_errors_total{{{SUP["a"]},op="extend"}}', "0+6x30"),
            S(f'forq_jobs_finished_total{{{SUP["a"]},queue="emails",task="send",outcome="lease_lost"}}',
              "0x10 1x20"),
        ],
        "alert_rule_test": [
            A("ForqRedisErrors", "25m",
              {"severity": "warning", "instance": "a:9464", "op": "extend"}),
            A("ForqLeasesLost", "15m", {"severity": "warning", "queue": "emails"}),
        ],
    },
    {
        "interval": "1m",
        "input_series": [  # one shard down for 5 minutes, then back
            S(f'forq_redis_shard_down{{{SUP["a"]},shard="10.0.0.2:7001"}}', "0x3 1x5 0x5"),
            S(f'forq_redis_shard_down{{{SUP["a"]},shard="10.0.0.1:7000"}}', "0x13"),
        ],
        "alert_rule_test": [
            A("ForqRedisShardDown", "4m"),
            A("ForqRedisShardDown", "7m",
              {"severity": "warning", "instance": "a:9464", "shard": "10.0.0.2:7001"}),
            A("ForqRedisShardDown", "12m"),
        ],
    },
]


def test_promtool_unit_tests(tmp_path: Path) -> None:
    rules = tmp_path / "forq-alerts.yml"
    rules.write_text(strip_annotations(RULES.read_text()))
    assert "annotations" not in rules.read_text()
    assert rules.read_text().count("alert:") == RULES.read_text().count("alert:")
    tests = tmp_path / "forq-alerts.test.yml"
    # JSON is YAML; no YAML library needed.
    tests.write_text(
        json.dumps(
            {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": UNIT_TESTS},
            indent=1,
        )
    )
    proc = subprocess.run(
        [promtool(), "test", "rules", str(tests)], capture_output=True, text=True, timeout=120
    )
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    covered = {t["alertname"] for group in UNIT_TESTS for t in group["alert_rule_test"]}
    assert covered == set(rule_exprs()), "every alert needs a unit test"


# -- Grafana dashboard --------------------------------------------------------


def panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows
    return out


def test_dashboard_loads_and_uses_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"

    known = exported_names()
    used: set[str] = set()
    ids = set()
    for panel in panels(dashboard):
        assert panel["id"] not in ids, "panel ids must be unique"
        ids.add(panel["id"])
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            names = metric_names(target["expr"])
            assert names, f"{panel['title']}: no metric in {target['expr']!r}"
            assert names <= known, f"{panel['title']}: unknown metrics {names - known}"
            used |= names
    for var in variables.values():
        if var["type"] == "query":
            query = var["query"]["query"]
            metric = re.match(r"label_values\((\w+),", query)
            assert metric and metric.group(1) in known, query

    # The panels the dashboard promises.
    titles = {p["title"] for p in panels(dashboard)}
    for title in (
        "Throughput by outcome",
        "Queue depth by state",
        "Wait time p50 / p99",
        "Duration p50 / p99 by task",
        "Children running vs slots",
        "Reclaims",
        "Redis errors by operation",
        "Child peak RSS p50 / p99 by task",
    ):
        assert title in titles
    assert {
        "forq_jobs_finished_total",
        "forq_queue_jobs",
        "forq_job_wait_seconds_bucket",
        "forq_job_duration_seconds_bucket",
        "forq_children_running",
        "forq_slots",
        "forq_reclaimed_total",
        "forq_redis_errors_total",
        "forq_child_peak_rss_bytes_bucket",
    } <= used
