//! The comparison report's figures (plotters, each drawn once per backend: SVG and PNG) and its
//! HTML and text tables. Text is set in DejaVu Sans, embedded, so a PNG looks the same on a
//! machine without fonts.
use crate::compare::{ModelReport, Report};
use crate::niah::Grid;
use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::Path;

const SIZE: (u32, u32) = (720, 440);
const FONT: &str = "sans-serif";

/// A figure of the report: its file stem under figures/ and its caption.
pub struct Figure {
    pub stem: String,
    pub caption: String,
}

fn palette(i: usize) -> RGBColor {
    const COLORS: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    COLORS[i % COLORS.len()]
}

type DrawResult<DB> = std::result::Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Draws `draw` into DIR/STEM.svg and DIR/STEM.png.
macro_rules! render {
    ($dir:expr, $stem:expr, $draw:ident ( $($arg:expr),* )) => {{
        let svg = $dir.join(format!("{}.svg", $stem));
        $draw(SVGBackend::new(&svg, SIZE).into_drawing_area(), $($arg),*).map_err(|e| anyhow!("{}: {e}", svg.display()))?;
        let png = $dir.join(format!("{}.png", $stem));
        $draw(BitMapBackend::new(&png, SIZE).into_drawing_area(), $($arg),*).map_err(|e| anyhow!("{}: {e}", png.display()))?;
    }};
}

/// Accuracy of each cell, rows = length, columns = depth, shaded white (0) to green (1).
fn heatmap<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, grid: &Grid, title: &str) -> DrawResult<DB> {
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    root.fill(&WHITE)?;
    let (nl, nd) = (grid.lengths.len(), grid.depths.len());
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        // A segmented 0..n holds n + 1 segments: the last index is n − 1.
        .build_cartesian_2d((0..nd.max(1) - 1).into_segmented(), (0..nl.max(1) - 1).into_segmented())?;
    let at = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => Some(*i),
        SegmentValue::Last => None,
    };
    let depths = grid.depths.clone();
    let lengths = grid.lengths.clone();
    chart
        .configure_mesh()
        .disable_mesh()
        .x_label_formatter(&|v| at(v).and_then(|i| depths.get(i)).map(|d| format!("{d}%")).unwrap_or_default())
        .y_label_formatter(&|v| at(v).and_then(|i| lengths.get(i)).map(|l| l.to_string()).unwrap_or_default())
        .x_desc("needle depth")
        .y_desc("context length (tokens)")
        .label_style((FONT, 13))
        .draw()?;
    let centred = TextStyle::from((FONT, 15).into_font()).color(&BLACK).pos(Pos::new(HPos::Center, VPos::Center));
    for (li, &l) in grid.lengths.iter().enumerate() {
        for (di, &d) in grid.depths.iter().enumerate() {
            let acc = grid.cells.iter().find(|c| c.length == l && c.depth == d).map_or(0.0, |c| c.accuracy);
            let shade = |full: u8| (255.0 - acc * (255.0 - full as f64)) as u8;
            let corner = |x: usize, y: usize| (SegmentValue::Exact(x), SegmentValue::Exact(y));
            chart.draw_series(std::iter::once(Rectangle::new([corner(di, li), corner(di + 1, li + 1)], RGBColor(shade(44), shade(160), shade(44)).filled())))?;
            chart.draw_series(std::iter::once(Rectangle::new([corner(di, li), corner(di + 1, li + 1)], WHITE.stroke_width(1))))?;
            chart.draw_series(std::iter::once(Text::new(format!("{acc:.2}"), (SegmentValue::CenterOf(di), SegmentValue::CenterOf(li)), centred.clone())))?;
        }
    }
    root.present()
}

/// How an x value is labelled: plain (whole numbers without decimals), or x = log2 of a length.
#[derive(Clone, Copy)]
enum XAxis {
    Plain,
    Log2,
}

impl XAxis {
    fn label(self, x: f64) -> String {
        match self {
            XAxis::Plain if x.fract() == 0.0 => format!("{x:.0}"),
            XAxis::Plain => format!("{x:.2}"),
            XAxis::Log2 if x.fract() == 0.0 => format!("{:.0}", x.exp2()),
            XAxis::Log2 => String::new(),
        }
    }
}

/// One line per model: y against x, with the given axis names; y on a log scale if `log_y`.
#[allow(clippy::too_many_arguments)]
fn lines<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, title: &str, x_axis: XAxis, x_desc: &str, y_desc: &str, series: &[(String, Vec<(f64, f64)>)], y_range: Option<(f64, f64)>, log_y: bool) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let xs = series.iter().flat_map(|s| s.1.iter().map(|p| p.0));
    let (x0, x1) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| (a.min(x), b.max(x)));
    let ys = series.iter().flat_map(|s| s.1.iter().map(|p| p.1)).filter(|y| y.is_finite() && (!log_y || *y > 0.0));
    let (y0, y1) = y_range.unwrap_or_else(|| ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), y| (a.min(y), b.max(y))));
    let (x0, x1) = if x0 < x1 { (x0, x1) } else { (x0 - 1.0, x0 + 1.0) };
    let (y0, y1) = if y0 < y1 { (y0, y1) } else { (y0 - 1.0, y0 + 1.0) };
    let mut builder = ChartBuilder::on(&root);
    builder.caption(title, (FONT, 20)).margin(12).x_label_area_size(40).y_label_area_size(70);
    macro_rules! draw_on {
        ($chart:expr) => {{
            let mut chart = $chart;
            let x_label = |x: &f64| x_axis.label(*x);
            chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).x_label_formatter(&x_label).label_style((FONT, 13)).draw()?;
            for (i, (name, points)) in series.iter().enumerate() {
                let color = palette(i);
                let pts: Vec<(f64, f64)> = points.iter().copied().filter(|p| p.1.is_finite() && (!log_y || p.1 > 0.0)).collect();
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                    .label(name.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
                if pts.len() <= 40 {
                    chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
                }
            }
            chart.configure_series_labels().background_style(WHITE.mix(0.85)).border_style(BLACK).label_font((FONT, 13)).draw()?;
        }};
    }
    if log_y {
        draw_on!(builder.build_cartesian_2d(x0..x1, (y0..y1).log_scale())?);
    } else {
        draw_on!(builder.build_cartesian_2d(x0..x1, y0..y1)?);
    }
    root.present()
}

/// Labelled points, x against y, each name written beside its point; a log x axis when the
/// x values are positive and span more than two decades.
fn scatter<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, title: &str, x_desc: &str, y_desc: &str, points: &[(String, f64, f64)]) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let pts: Vec<&(String, f64, f64)> = points.iter().filter(|p| p.1.is_finite() && p.2.is_finite()).collect();
    let span = |v: Vec<f64>| {
        let (a, b) = v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
        if a < b { (a, b) } else { (a - 1.0, a + 1.0) }
    };
    let (x0, x1) = span(pts.iter().map(|p| p.1).collect());
    let (y0, y1) = span(pts.iter().map(|p| p.2).collect());
    let pad = (y1 - y0) * 0.1;
    let log_x = x0 > 0.0 && x1 / x0 > 100.0;
    let mut builder = ChartBuilder::on(&root);
    builder.caption(title, (FONT, 20)).margin(12).x_label_area_size(40).y_label_area_size(70);
    macro_rules! draw_on {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart.configure_mesh().x_desc(x_desc).y_desc(y_desc).label_style((FONT, 13)).draw()?;
            for (i, p) in pts.iter().enumerate() {
                let color = palette(i);
                // The name beside its point, offset in pixels so it does not cover the dot.
                let mark = EmptyElement::at((p.1, p.2)) + Circle::new((0, 0), 5, color.filled()) + Text::new(p.0.clone(), (8, -6), (FONT, 13).into_font().color(&color));
                chart.draw_series(std::iter::once(mark))?;
            }
        }};
    }
    if log_x {
        draw_on!(builder.build_cartesian_2d((x0 * 0.8..x1 * 1.25).log_scale(), y0 - pad..y1 + pad)?);
    } else {
        let xpad = (x1 - x0) * 0.1;
        draw_on!(builder.build_cartesian_2d(x0 - xpad..x1 + xpad, y0 - pad..y1 + pad)?);
    }
    root.present()
}

/// A study's own figures: `score` against training tokens per mixer, and the stage-1 probe
/// against the final score (`probe`: name, probe loss, score) with Spearman's ρ in its title.
pub fn study_figures(dir: &Path, score: &str, curves: &[(String, Vec<(f64, f64)>)], probe: &[(String, f64, f64)], rho: Option<f64>) -> Result<Vec<Figure>> {
    plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).map_err(|_| anyhow!("the embedded DejaVu Sans did not load"))?;
    let mut out = Vec::new();
    if curves.iter().any(|c| !c.1.is_empty()) {
        let max = curves.iter().flat_map(|c| c.1.iter().map(|p| p.0)).fold(0.0, f64::max);
        let (unit, name) = if max >= 1e6 { (1e6, "millions of tokens") } else if max >= 1e3 { (1e3, "thousands of tokens") } else { (1.0, "tokens") };
        let scaled: Vec<(String, Vec<(f64, f64)>)> = curves.iter().map(|(n, pts)| (n.clone(), pts.iter().map(|&(x, y)| (x / unit, y)).collect())).collect();
        render!(dir, "study-tokens", lines(&format!("{score} against training tokens"), XAxis::Plain, &format!("training tokens ({name})"), score, &scaled, None, false));
        out.push(Figure { stem: "study-tokens".into(), caption: format!("{score} of every mixer's student against the tokens it was trained on (every evaluated point of every budget).") });
    }
    if probe.len() >= 2 {
        let title = format!("stage-1 probe against final {score} (Spearman ρ = {})", fmt(rho, 2));
        render!(dir, "study-probe", scatter(&title, "held-out stage-1 loss after stage 1 (lower is better)", &format!("final {score}"), probe));
        out.push(Figure { stem: "study-probe".into(), caption: "The cheap probe (stage 1 alone) against the result of the full run: a probe that predicts the ranking puts low losses high.".into() });
    }
    Ok(out)
}

/// Draws every figure the report's numbers allow into `dir`; returns them in display order.
pub fn figures(dir: &Path, report: &Report) -> Result<Vec<Figure>> {
    // Registering twice is harmless; the first registration is the one used.
    plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).map_err(|_| anyhow!("the embedded DejaVu Sans did not load"))?;
    let mut out = Vec::new();
    let with_niah: Vec<&ModelReport> = report.models.iter().filter(|m| m.niah.as_ref().is_some_and(|g| !g.cells.is_empty())).collect();
    for m in &with_niah {
        let g = m.niah.as_ref().expect("filtered");
        let stem = format!("niah-{}", m.label);
        let title = format!("{} — {} ({})", g.task, m.label, m.kind);
        render!(dir, stem, heatmap(g, &title));
        out.push(Figure { stem, caption: format!("Needle retrieval of {} by context length and depth ({} sample(s) per cell).", m.label, g.samples) });
    }
    if !with_niah.is_empty() {
        let series: Vec<(String, Vec<(f64, f64)>)> = with_niah.iter().map(|m| (m.label.clone(), m.niah.as_ref().expect("filtered").by_length().into_iter().map(|(l, a)| ((l as f64).log2(), a)).collect())).collect();
        render!(dir, "niah-accuracy", lines("retrieval accuracy against context length", XAxis::Log2, "context length (tokens, log scale)", "accuracy (mean over depths)", &series, Some((-0.02, 1.02)), false));
        out.push(Figure { stem: "niah-accuracy".into(), caption: "Needle retrieval accuracy, averaged over depths, against the haystack's length.".into() });
    }
    let students: Vec<&ModelReport> = report.models.iter().filter(|m| m.saturation.as_ref().is_some_and(|s| !s.position.is_empty())).collect();
    if !students.is_empty() {
        // One line per student: a per-read value against the position of the read.
        let over_position = |value: fn(&crate::compare::Saturation) -> &Vec<f64>| -> Vec<(String, Vec<(f64, f64)>)> {
            students
                .iter()
                .map(|m| {
                    let s = m.saturation.as_ref().expect("filtered");
                    (m.label.clone(), s.position.iter().zip(value(s)).map(|(&p, &v)| (p as f64, v)).collect())
                })
                .collect()
        };
        let norm = over_position(|s| &s.state_norm);
        render!(dir, "state-norm", lines("mixer state norm over position", XAxis::Plain, "position (tokens of held-out prose)", "‖S‖ (mean over blocks and heads)", &norm, None, true));
        out.push(Figure { stem: "state-norm".into(), caption: "Frobenius norm of the mixer state as held-out prose is read: additive states grow, gated and delta-rule states stay bounded.".into() });
        let rank = over_position(|s| &s.effective_rank);
        render!(dir, "effective-rank", lines("effective rank of the mixer state", XAxis::Plain, "position (tokens of held-out prose)", "effective rank (mean over blocks and heads)", &rank, None, false));
        out.push(Figure { stem: "effective-rank".into(), caption: "Effective rank of the state (exp of the entropy of its normalised singular values) over position.".into() });
    }
    for stage in 1..=4u8 {
        let series: Vec<(String, Vec<(f64, f64)>)> = report
            .models
            .iter()
            .filter_map(|m| {
                let d = m.distillation.as_ref()?;
                let (_, points) = d.loss.iter().find(|(s, _)| *s == stage)?;
                Some((m.label.clone(), points.iter().map(|&(s, l)| (s as f64, l)).collect()))
            })
            .collect();
        if series.is_empty() {
            continue;
        }
        let what = ["mixer-output MSE (sum over layers)", "hidden-state L2 (sum over layers)", "CE + KL", "instruction tuning: CE on the assistant's tokens"][stage as usize - 1];
        let stem = format!("distill-stage{stage}");
        render!(dir, stem, lines(&format!("distillation stage {stage}: {what}"), XAxis::Plain, "step", "training loss", &series, None, true));
        out.push(Figure { stem, caption: format!("Training loss of distillation stage {stage} ({what}) per step.") });
    }
    Ok(out)
}

pub fn fmt(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".into(), |v| format!("{v:.digits$}"))
}

/// The score a task contributes to the average: acc_norm where it has one, acc otherwise.
fn headline(m: &ModelReport, task: &str) -> Option<f64> {
    m.tasks.iter().find(|t| t.task == task).map(|t| t.acc_norm.unwrap_or(t.acc))
}

/// `s` as HTML text or a quoted attribute value.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

/// The start of a report page, up to and including its heading.
pub fn html_head(title: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{0}</title>\n<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}}table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}th:first-child,td:first-child{{text-align:left}}figure{{margin:1.5em 0}}img{{max-width:100%}}</style></head><body>\n<h1>{0}</h1>\n",
        esc(title)
    )
}

pub fn html(report: &Report, figures: &[Figure]) -> String {
    let mut h = html_head("Linearized models compared");
    h.push_str(&html_sections(report, figures));
    h.push_str("<p>The same numbers: <a href=\"report.json\">report.json</a>.</p>\n</body></html>\n");
    h
}

/// The tables and figures of a comparison, as sections of a page.
pub fn html_sections(report: &Report, figures: &[Figure]) -> String {
    let mut h = String::new();
    let models: Vec<String> = report.models.iter().map(|m| format!("<b>{}</b> ({}: <code>{}</code>)", esc(&m.label), esc(&m.kind), esc(&m.model))).collect();
    let _ = writeln!(h, "<p>Models: {}.</p>", models.join(", "));
    if !report.tasks.is_empty() {
        let docs = report.limit.map_or("all documents".to_string(), |n| format!("the first {n} documents of each task"));
        let _ = writeln!(h, "<h2>Zero-shot tasks</h2>\n<p>Scored as lm-evaluation-harness scores them on {docs}: acc_norm for multiple choice (acc for WinoGrande and LAMBADA). Recovery = a model's average / the average of {}.</p>", report.reference.as_deref().map_or("the teacher".into(), esc));
        h.push_str("<table><tr><th>model</th>");
        for t in &report.tasks {
            let _ = write!(h, "<th>{t}</th>");
        }
        h.push_str("<th>average</th><th>recovery</th><th>LAMBADA ppl</th></tr>\n");
        for m in &report.models {
            let _ = write!(h, "<tr><td>{}</td>", esc(&m.label));
            for t in &report.tasks {
                let _ = write!(h, "<td>{}</td>", fmt(headline(m, t), 4));
            }
            let ppl = m.tasks.iter().find_map(|t| t.perplexity);
            let _ = writeln!(h, "<td><b>{}</b></td><td>{}</td><td>{}</td></tr>", fmt(m.average, 4), fmt(m.recovery, 3), fmt(ppl, 2));
        }
        h.push_str("</table>\n<details><summary>acc and acc_norm per task</summary><table><tr><th>model</th><th>task</th><th>docs</th><th>acc</th><th>acc_norm</th></tr>\n");
        for m in &report.models {
            for t in &m.tasks {
                let _ = writeln!(h, "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.4}</td><td>{}</td></tr>", esc(&m.label), t.task, t.docs, t.acc, fmt(t.acc_norm, 4));
            }
        }
        h.push_str("</table></details>\n");
    }
    if let Some(g) = report.models.iter().find_map(|m| m.niah.as_ref()) {
        let _ = writeln!(h, "<h2>Needle in a haystack ({})</h2>\n<p>Accuracy averaged over depths {:?} %, {} sample(s) per cell, greedy decoding, exact match.</p>", g.task, g.depths, g.samples);
        h.push_str("<table><tr><th>model</th>");
        for l in &g.lengths {
            let _ = write!(h, "<th>{l}</th>");
        }
        h.push_str("</tr>\n");
        for m in &report.models {
            let Some(g) = &m.niah else { continue };
            let _ = write!(h, "<tr><td>{}</td>", esc(&m.label));
            for (_, a) in g.by_length() {
                let _ = write!(h, "<td>{a:.2}</td>");
            }
            h.push_str("</tr>\n");
        }
        h.push_str("</table>\n");
    }
    if report.models.iter().any(|m| m.saturation.is_some() || m.distillation.is_some()) {
        h.push_str("<h2>Students</h2>\n<table><tr><th>model</th><th>mixer</th><th>state norm (first → last read)</th><th>effective rank (first → last)</th><th>held-out ppl after distillation</th><th>teacher ppl</th></tr>\n");
        for m in report.models.iter().filter(|m| m.kind != "teacher") {
            let ends = |v: Option<&Vec<f64>>| v.and_then(|v| Some(format!("{:.2} → {:.2}", v.first()?, v.last()?))).unwrap_or("–".into());
            let s = m.saturation.as_ref();
            let d = m.distillation.as_ref();
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&m.label),
                esc(&m.kind),
                ends(s.map(|s| &s.state_norm)),
                ends(s.map(|s| &s.effective_rank)),
                fmt(d.and_then(|d| d.student_perplexity), 2),
                fmt(d.and_then(|d| d.teacher_perplexity), 2)
            );
        }
        h.push_str("</table>\n");
    }
    if !figures.is_empty() {
        h.push_str("<h2>Figures</h2>\n");
        for f in figures {
            h.push_str(&figure_html(f));
        }
    }
    h
}

/// A figure as it sits in a page: the SVG, its caption, a link to the PNG.
pub fn figure_html(f: &Figure) -> String {
    format!("<figure><img src=\"figures/{0}.svg\" alt=\"{1}\"><figcaption>{1} (<a href=\"figures/{0}.png\">PNG</a>)</figcaption></figure>\n", f.stem, esc(&f.caption))
}

/// The zero-shot and NIAH tables as plain text.
pub fn text_table(report: &Report) -> String {
    let mut s = String::new();
    if !report.tasks.is_empty() {
        let _ = write!(s, "{:24}", "model");
        for t in &report.tasks {
            let _ = write!(s, "{:>14}", t);
        }
        let _ = writeln!(s, "{:>9}{:>10}", "average", "recovery");
        for m in &report.models {
            let _ = write!(s, "{:24}", m.label);
            for t in &report.tasks {
                let _ = write!(s, "{:>14}", fmt(headline(m, t), 4));
            }
            let _ = writeln!(s, "{:>9}{:>10}", fmt(m.average, 4), fmt(m.recovery, 3));
        }
    }
    if let Some(g) = report.models.iter().find_map(|m| m.niah.as_ref()) {
        let _ = write!(s, "\n{:24}", format!("{} by length", g.task));
        for l in &g.lengths {
            let _ = write!(s, "{l:>7}");
        }
        s.push('\n');
        for m in &report.models {
            let Some(g) = &m.niah else { continue };
            let _ = write!(s, "{:24}", m.label);
            for (_, a) in g.by_length() {
                let _ = write!(s, "{a:>7.2}");
            }
            s.push('\n');
        }
    }
    s
}
