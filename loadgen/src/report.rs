//! What a run prints and writes: the per-operation table (stdout), the JSON report whose keys
//! scripts rely on (`target`, `scenario`, `duration_s`, `ops_total`, `throughput_ops_per_s`,
//! `errors`, `ops.<name>.latency_us.{p50,p90,p99,p999,max}`), and an SVG plot (throughput and
//! p99 over time, and each operation's latency percentile curve). A run whose details carry
//! `figures` (scale) prints them as a table of figures with their targets instead of the raw
//! details, and one whose details carry `node_rss_series` gets a panel of the nodes' memory
//! over time on top of its plot, marked with the run's `phases`.
//!
//! Pure formatting over a finished [`Report`]; must not depend on the targets.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;
use serde_json::Value;

use crate::scenario::{RunOutcome, ms};
use crate::stats::{IntervalSample, OpSummary, Percentiles};

/// Top-level keys of the JSON report that scripts rely on (the contract; per operation
/// also `ops.<name>.latency_us.{p50,p90,p99,p999,max}`).
pub const REPORT_KEYS: [&str; 6] = [
    "target",
    "scenario",
    "duration_s",
    "ops_total",
    "throughput_ops_per_s",
    "errors",
];

/// A finished run, ready to print and write.
#[derive(Debug, Serialize)]
pub struct Report {
    /// `tenure`, `tenure-http` or `etcd`.
    pub target: String,
    /// The scenario's name.
    pub scenario: String,
    /// `closed` or `open`.
    pub mode: String,
    /// Concurrent workers.
    pub workers: usize,
    /// Open-loop target rate, if any.
    pub rate_ops_per_s: Option<f64>,
    /// Seconds measured.
    pub duration_s: f64,
    /// Operations answered in the measured window (for `hold`: renewals).
    pub ops_total: u64,
    /// Of those, successes.
    pub ops_ok: u64,
    /// `ops_total / duration_s`.
    pub throughput_ops_per_s: f64,
    /// Refusals and failures by code, all operations together.
    pub errors: BTreeMap<String, u64>,
    /// Latency of all operations together.
    pub latency_us: Percentiles,
    /// Per operation.
    pub ops: BTreeMap<String, OpSummary>,
    /// One sample per second.
    pub timeline: Vec<IntervalSample>,
    /// Scenario-specific figures.
    pub details: Value,
    /// The run's settings.
    pub config: Value,
}

/// Errors writing the report or the plot.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// File system.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Encoding.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Drawing.
    #[error("plot {path}: {message}")]
    Plot {
        /// The file.
        path: String,
        /// What plotters said.
        message: String,
    },
}

impl Report {
    /// Builds the report of a run.
    pub fn new(
        target: &str,
        scenario: &str,
        workers: usize,
        rate_ops_per_s: Option<f64>,
        outcome: RunOutcome,
        config: Value,
    ) -> Report {
        let mut errors = BTreeMap::new();
        let mut ops = BTreeMap::new();
        let mut ops_ok = 0;
        for (op, summary) in outcome.summary {
            for (code, count) in &summary.errors {
                *errors.entry(code.clone()).or_insert(0) += count;
            }
            ops_ok += summary.ok;
            ops.insert(op.name().to_owned(), summary);
        }
        if scenario == "hold" {
            // Throughput of hold is renewals; they all succeeded unless counted as errors.
            ops_ok = outcome.ops_total;
        }
        #[allow(clippy::cast_precision_loss)]
        let throughput = outcome.ops_total as f64 / outcome.measured_s.max(1e-9);
        Report {
            target: target.to_owned(),
            scenario: scenario.to_owned(),
            mode: if rate_ops_per_s.is_some() {
                "open"
            } else {
                "closed"
            }
            .to_owned(),
            workers,
            rate_ops_per_s,
            duration_s: outcome.measured_s,
            ops_total: outcome.ops_total,
            ops_ok,
            throughput_ops_per_s: throughput,
            errors,
            latency_us: outcome.latency_us,
            ops,
            timeline: outcome.timeline,
            details: outcome.details,
            config,
        }
    }

    /// The end-of-run table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let mode = match self.rate_ops_per_s {
            Some(rate) => format!("open loop at {rate:.0} ops/s, {} workers", self.workers),
            None => format!("closed loop, {} workers", self.workers),
        };
        let _ = writeln!(
            out,
            "target {}  scenario {}  {mode}  {:.1} s  {} ops ({} ok)  {:.0} ops/s",
            self.target,
            self.scenario,
            self.duration_s,
            self.ops_total,
            self.ops_ok,
            self.throughput_ops_per_s
        );
        let _ = writeln!(
            out,
            "{:<8} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}  errors",
            "op", "count", "ok", "p50 ms", "p90 ms", "p99 ms", "p999 ms", "max ms"
        );
        for (name, op) in &self.ops {
            let latency = op.latency_us;
            let _ = writeln!(
                out,
                "{name:<8} {:>10} {:>10} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}  {}",
                op.count,
                op.ok,
                ms(latency.p50),
                ms(latency.p90),
                ms(latency.p99),
                ms(latency.p999),
                ms(latency.max),
                crate::scenario::errors_text(&op.errors)
            );
        }
        if let Some(figures) = self.details["figures"].as_array() {
            out.push_str(&figures_table(figures));
        } else if !self.details.is_null()
            && self.details.as_object().is_some_and(|map| !map.is_empty())
        {
            let _ = writeln!(out, "details {}", self.details);
        }
        out
    }

    /// Writes the JSON report.
    pub fn write_json(&self, path: &Path) -> Result<(), ReportError> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text).map_err(|source| ReportError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// Draws the SVG plot.
    pub fn write_plot(&self, path: &Path) -> Result<(), ReportError> {
        self.draw(path).map_err(|message| ReportError::Plot {
            path: path.display().to_string(),
            message,
        })
    }

    fn draw(&self, path: &Path) -> Result<(), String> {
        let error = |e: &dyn std::fmt::Display| e.to_string();
        let rss = rss_series(&self.details);
        let (panels, height) = if rss.is_empty() { (3, 1050) } else { (4, 1400) };
        let root = SVGBackend::new(path, (1000, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| error(&e))?;
        let title = format!(
            "{} / {} ({}, {:.0} ops/s)",
            self.target, self.scenario, self.mode, self.throughput_ops_per_s
        );
        let root = root
            .titled(&title, ("sans-serif", 22))
            .map_err(|e| error(&e))?;
        let all_areas = root.split_evenly((panels, 1));
        let t_max = self
            .timeline
            .iter()
            .map(|sample| sample.t_s)
            .chain(
                rss.iter()
                    .flat_map(|(_, points)| points.iter().map(|(t, _)| *t)),
            )
            .fold(1.0, f64::max);
        let areas = if rss.is_empty() {
            &all_areas[..]
        } else {
            let colors = [BLUE, RED, GREEN, MAGENTA, CYAN, BLACK];
            let lines: Vec<(Vec<(f64, f64)>, RGBColor)> = rss
                .iter()
                .enumerate()
                .map(|(index, (_, points))| (points.clone(), colors[index % colors.len()]))
                .collect();
            let nodes: Vec<String> = rss
                .iter()
                .enumerate()
                .map(|(index, (node, _))| {
                    format!(
                        "node {node} {}",
                        ["blue", "red", "green", "magenta", "cyan", "black"][index % 6]
                    )
                })
                .collect();
            time_chart(
                &all_areas[0],
                &format!("node resident memory, MiB ({})", nodes.join(", ")),
                "MiB",
                t_max,
                &lines,
            )?;
            &all_areas[1..]
        };
        let phases = phase_marks(&self.details);
        if !phases.is_empty() {
            mark_phases(&all_areas[0], t_max, &phases)?;
        }

        // Throughput over time, then p99 and p50 over time.
        let throughput: Vec<(f64, f64)> = self
            .timeline
            .iter()
            .map(|sample| (sample.t_s, sample.ops_per_s))
            .collect();
        time_chart(
            &areas[0],
            "throughput (operations answered per second)",
            "ops/s",
            t_max,
            &[(throughput, BLUE)],
        )?;
        let p99: Vec<(f64, f64)> = self
            .timeline
            .iter()
            .map(|sample| (sample.t_s, ms(sample.p99_us)))
            .collect();
        let p50: Vec<(f64, f64)> = self
            .timeline
            .iter()
            .map(|sample| (sample.t_s, ms(sample.p50_us)))
            .collect();
        time_chart(
            &areas[1],
            "latency per second: p99 (red), p50 (green)",
            "ms",
            t_max,
            &[(p99, RED), (p50, GREEN)],
        )?;

        // Latency percentile curves: x is the number of nines, -log10(1 - p).
        let latency_max = self
            .ops
            .values()
            .map(|op| ms(op.latency_us.max))
            .fold(0.1, f64::max)
            * 1.5;
        // From half the smallest median down the curves, so the curves fill the panel.
        let latency_min = self
            .ops
            .values()
            .map(|op| ms(op.latency_us.p50) / 2.0)
            .fold(f64::INFINITY, f64::min)
            .clamp(0.001, latency_max / 10.0);
        let mut chart = ChartBuilder::on(&areas[2])
            .caption("latency by percentile, per operation", ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..5.0, (latency_min..latency_max).log_scale())
            .map_err(|e| error(&e))?;
        chart
            .configure_mesh()
            .x_desc("percentile")
            .y_desc("ms")
            .x_labels(6)
            .x_label_formatter(&|nines| percentile_label(*nines))
            .draw()
            .map_err(|e| error(&e))?;
        let colors = [BLUE, RED, GREEN, MAGENTA];
        for (index, (name, op)) in self.ops.iter().enumerate() {
            let color = colors[index % colors.len()];
            let points: Vec<(f64, f64)> = op
                .curve
                .iter()
                .filter(|(percentile, _)| *percentile < 100.0)
                .map(|(percentile, us)| {
                    (
                        -(1.0 - percentile / 100.0).log10(),
                        ms(*us).max(latency_min),
                    )
                })
                .collect();
            chart
                .draw_series(LineSeries::new(points, &color))
                .map_err(|e| error(&e))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(|e| error(&e))?;
        root.present().map_err(|e| error(&e))?;
        Ok(())
    }
}

/// One panel of lines over time (seconds); the y axis runs from 0 to 110% of the largest value.
fn time_chart(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    y_desc: &str,
    t_max: f64,
    lines: &[(Vec<(f64, f64)>, RGBColor)],
) -> Result<(), String> {
    let error = |e: &dyn std::fmt::Display| e.to_string();
    let y_max = lines
        .iter()
        .flat_map(|(points, _)| points.iter().map(|(_, y)| *y))
        .fold(0.1, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)
        .map_err(|e| error(&e))?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc(y_desc)
        .draw()
        .map_err(|e| error(&e))?;
    for (points, color) in lines {
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color))
            .map_err(|e| error(&e))?;
    }
    Ok(())
}

/// The nodes' memory series of a scale run's details: per node, `(t_s, MiB)` points.
fn rss_series(details: &Value) -> Vec<(u64, Vec<(f64, f64)>)> {
    let Some(series) = details["node_rss_series"].as_array() else {
        return Vec::new();
    };
    series
        .iter()
        .filter_map(|node| {
            let id = node["node"].as_u64()?;
            let points = node["points"]
                .as_array()?
                .iter()
                .filter_map(|point| {
                    let t = point.get(0)?.as_f64()?;
                    let bytes = point.get(1)?.as_f64()?;
                    Some((t, bytes / 1_048_576.0))
                })
                .collect();
            Some((id, points))
        })
        .collect()
}

/// The starts of a run's phases (`details.phases`): `(t_s, name)`.
fn phase_marks(details: &Value) -> Vec<(f64, String)> {
    details["phases"]
        .as_array()
        .map_or_else(Vec::new, |phases| {
            phases
                .iter()
                .filter_map(|phase| {
                    Some((
                        phase["from_s"].as_f64()?,
                        phase["name"].as_str()?.to_owned(),
                    ))
                })
                .collect()
        })
}

/// Thin grey lines at the phases' starts across a panel, each labelled at its top.
fn mark_phases(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    t_max: f64,
    phases: &[(f64, String)],
) -> Result<(), String> {
    let error = |e: &dyn std::fmt::Display| e.to_string();
    // The same margins as `time_chart`, so the marks line up with its x axis.
    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .caption(" ", ("sans-serif", 16))
        .build_cartesian_2d(0.0..t_max, 0.0..1.0)
        .map_err(|e| error(&e))?;
    let grey = RGBColor(150, 150, 150);
    for (index, (t, name)) in phases.iter().enumerate() {
        chart
            .draw_series(LineSeries::new([(*t, 0.0), (*t, 1.0)], &grey))
            .map_err(|e| error(&e))?;
        // Labels alternate in height so that close phases stay readable.
        #[allow(clippy::cast_precision_loss)]
        let y = 0.97 - (index % 3) as f64 * 0.06;
        chart
            .draw_series(std::iter::once(Text::new(
                name.clone(),
                (*t, y),
                ("sans-serif", 11).into_font().color(&grey),
            )))
            .map_err(|e| error(&e))?;
    }
    Ok(())
}

/// The figures of a scale run as a table: item, figure, value, target, verdict.
fn figures_table(figures: &[Value]) -> String {
    let rows: Vec<[String; 5]> = figures
        .iter()
        .map(|row| {
            let text = |key: &str| row[key].as_str().unwrap_or("-").to_owned();
            [
                text("item"),
                text("figure"),
                text("value"),
                text("target"),
                text("verdict"),
            ]
        })
        .collect();
    let header = [
        "item".to_owned(),
        "figure".to_owned(),
        "value".to_owned(),
        "target".to_owned(),
        "verdict".to_owned(),
    ];
    let mut widths = [0usize; 5];
    for row in std::iter::once(&header).chain(&rows) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let _ = writeln!(
            out,
            "{:<w0$}  {:<w1$}  {:<w2$}  {:<w3$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            row[4],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3],
        );
    }
    out
}

/// `50%`, `90%`, `99%`, `99.9%` ... for a number of nines.
fn percentile_label(nines: f64) -> String {
    let percentile = 100.0 * (1.0 - 10f64.powf(-nines));
    let text = format!("{percentile:.4}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}%")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{OpKind, Recorder};
    use std::time::Duration;

    fn sample_report() -> Report {
        let recorder = Recorder::new();
        for index in 0..1000u64 {
            recorder.record(
                0,
                OpKind::Acquire,
                Duration::from_micros(500 + index),
                if index % 100 == 0 {
                    Err("ALREADY_HELD")
                } else {
                    Ok(())
                },
            );
            recorder.record(1, OpKind::Renew, Duration::from_micros(300 + index), Ok(()));
        }
        let timeline = vec![
            recorder.take_interval(1.0, 1.0),
            recorder.take_interval(2.0, 1.0),
        ];
        let outcome = RunOutcome {
            measured_s: 2.0,
            latency_us: recorder.overall(),
            summary: recorder.summary(),
            timeline,
            ops_total: 2000,
            details: serde_json::json!({}),
        };
        Report::new("tenure", "mixed", 4, None, outcome, serde_json::json!({}))
    }

    #[test]
    fn json_has_the_keys_scripts_rely_on() {
        let report = sample_report();
        let value = serde_json::to_value(&report).unwrap();
        // The literal list is the contract; REPORT_KEYS must say the same.
        let contract = [
            "target",
            "scenario",
            "duration_s",
            "ops_total",
            "throughput_ops_per_s",
            "errors",
        ];
        assert_eq!(REPORT_KEYS, contract);
        for key in contract {
            assert!(value.get(key).is_some(), "{key} missing");
        }
        assert_eq!(value["errors"]["ALREADY_HELD"], 10);
        assert_eq!(value["throughput_ops_per_s"], 1000.0);
        for name in ["acquire", "renew"] {
            for key in ["p50", "p90", "p99", "p999", "max"] {
                assert!(value["ops"][name]["latency_us"][key].as_u64().unwrap() > 0);
            }
        }
        assert!(report.table().contains("ALREADY_HELD:10"));
    }

    #[test]
    fn plot_is_an_svg_with_every_panel() {
        let report = sample_report();
        let dir = std::env::temp_dir().join(format!("loadgen-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("plot.svg");
        report.write_plot(&path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("throughput"));
        assert!(svg.contains("latency by percentile"));
        assert!(svg.contains("99.9%"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn scale_details_give_a_figures_table_and_a_memory_panel() {
        let mut report = sample_report();
        report.scenario = "scale".into();
        report.details = serde_json::json!({
            "figures": [
                {"item": "7", "figure": "restart", "value": "3.20 s", "target": "<= 30 s", "verdict": "met"},
                {"item": "9", "figure": "storm p99", "value": "-", "target": "<= 2x", "verdict": "-"},
            ],
            "node_rss_series": [
                {"node": 1, "points": [[0.5, 104857600], [1.5, 209715200]]},
                {"node": 2, "points": [[0.5, 104857600]]},
            ],
            "phases": [{"name": "acquire", "from_s": 0.7, "to_s": 1.2}],
        });
        let table = report.table();
        assert!(table.contains("restart"), "{table}");
        assert!(table.contains("<= 30 s  met"), "{table}");
        assert!(!table.contains("node_rss_series"), "{table}");
        let dir = std::env::temp_dir().join(format!("loadgen-scale-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("plot.svg");
        report.write_plot(&path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("node resident memory"));
        assert!(svg.contains("acquire"));
        assert!(svg.contains("throughput"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn percentile_labels_read_well() {
        assert_eq!(percentile_label(1.0), "90%");
        assert_eq!(percentile_label(3.0), "99.9%");
        assert_eq!(percentile_label(0.0), "0%");
    }
}
