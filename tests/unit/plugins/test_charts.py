"""The training view's HTML: a chart per metric, the facts, the checkpoints, the Ray job's link."""

import re

from airflow_provider_horovod.plugins.charts import metric_names, page, polyline

HISTORY = [{"report": i, "metrics": {"loss": 1.0 / i, "epoch": i - 1, "accuracy": 0.1 * i}, "checkpoint": i % 2 == 0}
           for i in range(1, 7)]
RESULT = {"world_size": 4, "attempt": 2, "trainer_api": "v2", "timings": {"fit_s": 900.0},
          "dashboard_url": "http://ray:8265/#/jobs/ahp-x-a2", "submission_id": "ahp-x-a2",
          "checkpoint_uri": "s3://b/c", "best_checkpoint_uri": "s3://b/best", "resumed_from": "s3://b/old"}


def test_a_chart_per_metric_loss_first_with_the_checkpoints_marked():
    html = page(RESULT, {"history": HISTORY}, title="d / train / r")
    assert re.findall(r'data-metric="(\w+)"', html) == ["loss", "accuracy", "epoch"]
    assert html.count("<circle") == 3 * 3  # three checkpoints on each of three charts
    assert "1 &rarr; 0.166667" in html and "(min 0.166667, max 1, 6 reports)" in html
    assert "<h2>Checkpoints (3)</h2>" in html


def test_the_facts_and_the_links():
    html = page(RESULT, {"history": HISTORY}, title="t")
    assert "<dt>world size</dt><dd>4</dd>" in html and "<dt>attempt</dt><dd>2</dd>" in html
    assert "<dt>cost</dt><dd>1.000 worker-hours</dd>" in html  # 4 workers x 900 s
    assert 'class="ray-job" href="http://ray:8265/#/jobs/ahp-x-a2"' in html
    assert "<code>s3://b/best</code>" in html


def test_a_run_without_reports_or_record_says_so_and_escapes_what_it_shows():
    assert "This run reported no metrics." in page(RESULT, {"history": []}, title="t")
    html = page(None, None, title="<script>", problem="No training result <here>")
    assert "&lt;script&gt;" in html and "No training result &lt;here&gt;" in html and "<script>" not in html


def test_points_fill_the_box_and_a_flat_line_stays_inside():
    xs = [float(p.split(",")[0]) for p in polyline([3.0, 1.0, 2.0], [1, 2, 3]).split()]
    ys = [float(p.split(",")[1]) for p in polyline([3.0, 1.0, 2.0], [1, 2, 3]).split()]
    assert xs[0] == 80 and xs[-1] == 600 and min(ys) == 40 and max(ys) == 180
    assert all(40 <= float(p.split(",")[1]) <= 180 for p in polyline([5.0, 5.0], [1, 2]).split())
    assert metric_names([{"metrics": {"b": 1, "val_loss": 2, "acc": 3}}]) == ["val_loss", "acc", "b"]
