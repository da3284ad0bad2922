//! The study's report, from the results its jobs wrote: the hierarchy of mixers at the largest
//! budget, scores against training tokens, the stage-1 probe's ranking against the final one
//! (Spearman's ρ), what each arm changes against the paper's recipe, the students before and
//! after instruction tuning (when the study tunes), and the paper's findings
//! (MIXERS.md §1) each marked reproduced, not reproduced or not yet testable at this budget.
//! DIR/report.json, DIR/index.html and DIR/figures/ (built on `compare`'s tables and figures
//! for the students at the end of their runs).
use crate::{outln, out};
use crate::compare::{write_json, ModelReport, Report};
use crate::report::{esc, fmt};
use crate::study::{budget_label, job_dir, Arm, ArmKind, JobResult, Point, StudyConfig, TEACHER_JOB};
use anyhow::{anyhow, Result};
use linearize_core::eval::{ranks, spearman};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;

/// The paper's token budget for its 135M and 360M students (MIXERS.md §5).
pub const PAPER_TOKENS: u64 = 3_000_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Reproduced,
    NotReproduced,
    NotYetTestable,
}

impl Status {
    fn text(self) -> &'static str {
        match self {
            Status::Reproduced => "reproduced",
            Status::NotReproduced => "not reproduced",
            Status::NotYetTestable => "not yet testable",
        }
    }
}

/// One of the paper's findings and what this study says about it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Finding {
    pub claim: String,
    pub status: Status,
    pub evidence: String,
}

/// A mixer at the end of its run, in the hierarchy's arm and budget.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    pub mixer: String,
    pub job: String,
    pub average: Option<f64>,
    pub recovery: Option<f64>,
    /// Standard error of the average (binomial, per task, over the documents scored).
    pub se: Option<f64>,
    pub perplexity: f64,
    /// NIAH accuracy by length (mean over depths).
    pub niah: Vec<(usize, f64)>,
    pub probe: Option<f64>,
    /// 1 = best: the lowest probe loss, the highest final score.
    pub probe_rank: Option<f64>,
    pub final_rank: Option<f64>,
}

/// A mixer of the hierarchy before and after instruction tuning.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Tuning {
    pub mixer: String,
    pub before: Option<f64>,
    pub after: Option<f64>,
    /// Standard errors of the two averages.
    pub se_before: Option<f64>,
    pub se_after: Option<f64>,
    pub perplexity_before: f64,
    pub perplexity_after: f64,
    /// NIAH accuracy by length (mean over depths), before and after.
    pub niah_before: Vec<(usize, f64)>,
    pub niah_after: Vec<(usize, f64)>,
}

/// An arm against the paper's recipe for one mixer and budget (arm − paper).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Ablation {
    pub mixer: String,
    pub arm: Arm,
    pub kind: ArmKind,
    pub budget: u64,
    pub delta_average: Option<f64>,
    /// Standard error of the difference.
    pub se: Option<f64>,
    pub delta_perplexity: f64,
    pub delta_probe: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StudyReport {
    pub config: StudyConfig,
    pub paper_tokens: u64,
    pub teacher: Option<Point>,
    pub jobs: Vec<JobResult>,
    /// Jobs without a result yet.
    pub missing: Vec<String>,
    /// The arm and budget of the hierarchy and the findings: the paper's recipe (or the
    /// first arm) at the largest budget.
    pub arm: Arm,
    pub budget: u64,
    /// "recovery" (against the teacher) or "average" (no teacher score to divide by).
    pub score: String,
    pub hierarchy: Vec<Row>,
    /// Spearman's ρ of the probe's ranking against the final one in the hierarchy.
    pub probe_rho: Option<f64>,
    pub ablations: Vec<Ablation>,
    /// The hierarchy's mixers before and after instruction tuning (empty when the study does not tune).
    #[serde(default)]
    pub tuning: Vec<Tuning>,
    pub findings: Vec<Finding>,
}

fn read<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>> {
    let Ok(text) = std::fs::read_to_string(path) else { return Ok(None) };
    serde_json::from_str(&text).map(Some).map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// The variance of a model's zero-shot average: Σ_t p_t(1 − p_t)/n_t / T² over its tasks.
fn variance(m: &ModelReport) -> Option<f64> {
    if m.tasks.is_empty() {
        return None;
    }
    let t = m.tasks.len() as f64;
    Some(m.tasks.iter().map(|r| { let p = r.acc_norm.unwrap_or(r.acc); p * (1.0 - p) / r.docs.max(1) as f64 }).sum::<f64>() / (t * t))
}

/// Whether a difference stands out of the noise: more than two standard errors.
fn beyond_noise(d: f64, se: f64) -> bool {
    d.abs() > 2.0 * se
}

/// A claim that `d` > 0, with standard error `se`: within the noise, not yet testable.
fn judged(d: f64, se: f64) -> Status {
    if !beyond_noise(d, se) {
        Status::NotYetTestable
    } else if d > 0.0 {
        Status::Reproduced
    } else {
        Status::NotReproduced
    }
}

/// max − min of `v`.
fn span(v: &[f64]) -> f64 {
    v.iter().cloned().fold(f64::NEG_INFINITY, f64::max) - v.iter().cloned().fold(f64::INFINITY, f64::min)
}

/// Gathers the results in `out` into the report.
pub fn build(out: &Path, study: &StudyConfig) -> Result<StudyReport> {
    let teacher: Option<Point> = read(&job_dir(out, TEACHER_JOB).join("result.json"))?;
    let (mut jobs, mut missing) = (Vec::new(), Vec::new());
    for job in study.jobs() {
        match read::<JobResult>(&job_dir(out, &job.id).join("result.json"))? {
            Some(r) => jobs.push(r),
            None => missing.push(job.id),
        }
    }
    let base = teacher.as_ref().and_then(|t| t.report.average).filter(|&b| b > 0.0);
    for p in jobs.iter_mut().flat_map(|j| j.points.iter_mut()) {
        p.report.recovery = match (p.report.average, base) {
            (Some(a), Some(b)) => Some(a / b),
            _ => None,
        };
    }
    let score_of = |p: &Point| if base.is_some() { p.report.recovery } else { p.report.average };
    let arm = if study.arms.contains(&Arm::Paper) { Arm::Paper } else { study.arms[0] };
    let budget = *study.budgets.iter().max().expect("validated: at least one budget");
    let scale = base.unwrap_or(1.0);
    let niah = |p: &Point| p.report.niah.as_ref().map(|g| g.by_length()).unwrap_or_default();
    let mut hierarchy: Vec<Row> = jobs
        .iter()
        .filter(|j| j.arm == arm && j.budget == budget)
        .filter_map(|j| {
            let end = j.distilled_end()?;
            Some(Row {
                mixer: j.mixer.clone(),
                job: j.id.clone(),
                average: end.report.average,
                recovery: end.report.recovery,
                se: variance(&end.report).map(|v| v.sqrt()),
                perplexity: end.perplexity,
                niah: niah(end),
                probe: j.probe,
                probe_rank: None,
                final_rank: None,
            })
        })
        .collect();
    let final_score = |r: &Row| if base.is_some() { r.recovery } else { r.average };
    hierarchy.sort_by(|a, b| final_score(b).unwrap_or(f64::NEG_INFINITY).total_cmp(&final_score(a).unwrap_or(f64::NEG_INFINITY)));
    let ranked: Vec<usize> = (0..hierarchy.len()).filter(|&i| hierarchy[i].probe.is_some() && final_score(&hierarchy[i]).is_some()).collect();
    let probes: Vec<f64> = ranked.iter().map(|&i| hierarchy[i].probe.expect("filtered")).collect();
    let finals: Vec<f64> = ranked.iter().map(|&i| -final_score(&hierarchy[i]).expect("filtered")).collect();
    for (k, (pr, fr)) in ranked.iter().zip(ranks(&probes).into_iter().zip(ranks(&finals))) {
        hierarchy[*k].probe_rank = Some(pr);
        hierarchy[*k].final_rank = Some(fr);
    }
    let probe_rho = spearman(&probes, &finals);
    let mut ablations = Vec::new();
    for j in jobs.iter().filter(|j| j.arm != Arm::Paper) {
        let Some(paper) = jobs.iter().find(|p| p.arm == Arm::Paper && p.mixer == j.mixer && p.budget == j.budget) else { continue };
        let (Some(a), Some(b)) = (j.distilled_end(), paper.distilled_end()) else { continue };
        let delta_average = a.report.average.zip(b.report.average).map(|(x, y)| x - y);
        let se = variance(&a.report).zip(variance(&b.report)).map(|(x, y)| (x + y).sqrt());
        ablations.push(Ablation { mixer: j.mixer.clone(), arm: j.arm, kind: j.arm.kind(), budget: j.budget, delta_average, se, delta_perplexity: a.perplexity - b.perplexity, delta_probe: j.probe.zip(paper.probe).map(|(x, y)| x - y) });
    }
    let tuning: Vec<Tuning> = hierarchy
        .iter()
        .filter_map(|row| {
            let j = jobs.iter().find(|j| j.id == row.job)?;
            let (b, a) = (j.distilled_end()?, j.tuned()?);
            Some(Tuning {
                mixer: row.mixer.clone(),
                before: b.report.average,
                after: a.report.average,
                se_before: variance(&b.report).map(f64::sqrt),
                se_after: variance(&a.report).map(f64::sqrt),
                perplexity_before: b.perplexity,
                perplexity_after: a.perplexity,
                niah_before: niah(b),
                niah_after: niah(a),
            })
        })
        .collect();
    let score = if base.is_some() { "recovery" } else { "average" }.to_string();
    let mut report = StudyReport { config: study.clone(), paper_tokens: PAPER_TOKENS, teacher, jobs, missing, arm, budget, score, hierarchy, probe_rho, ablations, tuning, findings: Vec::new() };
    report.findings = findings(&report, scale, &score_of);
    Ok(report)
}

/// The paper's findings (MIXERS.md §1), each judged from the report's numbers: a difference
/// counts only beyond two standard errors of the zero-shot averages.
fn findings(r: &StudyReport, scale: f64, score_of: &dyn Fn(&Point) -> Option<f64>) -> Vec<Finding> {
    let row = |m: &str| r.hierarchy.iter().find(|x| x.mixer == m);
    let avg_se = |rows: &[&Row]| -> Option<(f64, f64)> {
        let n = rows.len() as f64;
        let mean = rows.iter().map(|x| x.average).sum::<Option<f64>>()? / n;
        let var = rows.iter().map(|x| x.se.map(|s| s * s)).sum::<Option<f64>>()? / (n * n);
        Some((mean, var.sqrt()))
    };
    let tokens = format!("{} tokens ({:.3} % of the paper's {})", budget_label(r.budget), 100.0 * r.budget as f64 / r.paper_tokens as f64, budget_label(r.paper_tokens));
    let mut out = Vec::new();

    // 1. Gated beat ungated.
    let claim = "Gated models (mLSTM, Gated DeltaNet) beat ungated ones (Linear Attention, RetNet)".to_string();
    let gated: Vec<&Row> = ["gated_deltanet", "mlstm"].iter().filter_map(|m| row(m)).collect();
    let ungated: Vec<&Row> = ["linear_attn", "retnet"].iter().filter_map(|m| row(m)).collect();
    // The same question within one architecture: each gated mixer's no-decay arm against its
    // paper arm (reported beside the claim, which is about the mixers as the paper compares them).
    let within: Vec<String> = r.ablations.iter().filter(|a| a.arm == Arm::NoDecay && a.budget == r.budget).filter_map(|a| Some(format!("{} {:+.4} ± {:.4}", a.mixer, a.delta_average?, a.se?))).collect();
    let within = if within.is_empty() { String::new() } else { format!("; the decay removed within a mixer (no-decay against paper): {}", within.join(", ")) };
    out.push(match (avg_se(&gated), avg_se(&ungated)) {
        (Some((g, gs)), Some((u, us))) => {
            let (d, se) = (g - u, (gs * gs + us * us).sqrt());
            let evidence = format!("at {tokens}: mean zero-shot average of the gated {g:.4}, of the ungated {u:.4}: difference {d:+.4} ± {se:.4}");
            let status = judged(d, se);
            let evidence = if status == Status::NotYetTestable { format!("{evidence}, within two standard errors at this budget") } else { evidence };
            Finding { claim, status, evidence: format!("{evidence}{within}") }
        }
        _ => Finding { claim, status: Status::NotYetTestable, evidence: format!("needs zero-shot scores of at least one gated (gated_deltanet, mlstm) and one ungated (linear_attn, retnet) student{within}") },
    });

    // 2. Gated DeltaNet is best.
    let claim = "Gated DeltaNet recovers the most of the teacher".to_string();
    let best_other = r.hierarchy.iter().filter(|x| x.mixer != "gated_deltanet" && x.average.is_some()).max_by(|a, b| a.average.unwrap_or(0.0).total_cmp(&b.average.unwrap_or(0.0)));
    out.push(match (row("gated_deltanet"), best_other) {
        (Some(g), Some(o)) if g.average.is_some() => {
            let d = g.average.unwrap_or(0.0) - o.average.unwrap_or(0.0);
            let se = (g.se.unwrap_or(0.0).powi(2) + o.se.unwrap_or(0.0).powi(2)).sqrt();
            let evidence = format!("at {tokens}: Gated DeltaNet {:.4}, the best other ({}) {:.4}: difference {d:+.4} ± {se:.4}", g.average.unwrap_or(0.0), o.mixer, o.average.unwrap_or(0.0));
            let status = judged(d, se);
            Finding { claim, status, evidence }
        }
        _ => Finding { claim, status: Status::NotYetTestable, evidence: "needs zero-shot scores of Gated DeltaNet and another mixer".into() },
    });

    // 3. Gaps early and persisting: the ranking at each job's first point against its last.
    let claim = "The gaps between mixers are established early and persist".to_string();
    let curves: Vec<(&JobResult, f64, f64)> = r.jobs.iter().filter(|j| j.arm == r.arm && j.budget == r.budget && j.distilled().count() >= 2).filter_map(|j| Some((j, score_of(j.distilled().next()?)?, score_of(j.distilled_end()?)?))).collect();
    out.push(if curves.len() >= 3 {
        let first: Vec<f64> = curves.iter().map(|c| c.1).collect();
        let last: Vec<f64> = curves.iter().map(|c| c.2).collect();
        let rho = spearman(&first, &last);
        let spread = span(&last);
        let se = r.hierarchy.iter().filter_map(|x| x.se).fold(0.0, f64::max) * std::f64::consts::SQRT_2 / scale;
        let evidence = format!("{} mixers evaluated at {} and at the end of {tokens}: Spearman ρ of the two rankings {}; final spread {spread:.4}", curves.len(), budget_label(curves[0].0.points[0].tokens), fmt(rho, 2));
        match rho {
            Some(_) if !beyond_noise(spread, se) => Finding { claim, status: Status::NotYetTestable, evidence: format!("{evidence}, within two standard errors (2 × {se:.4})") },
            Some(rho) => Finding { claim, status: if rho >= 0.5 { Status::Reproduced } else { Status::NotReproduced }, evidence },
            None => Finding { claim, status: Status::NotYetTestable, evidence: format!("{evidence}: a ranking without spread") },
        }
    } else {
        Finding { claim, status: Status::NotYetTestable, evidence: "needs at least three mixers evaluated at two or more points (eval_at)".into() }
    });

    // 4. NIAH beyond 512 tokens.
    let claim = "Needle in a haystack: Linear Attention and RetNet fail beyond 512 tokens; Gated DeltaNet keeps retrieving".to_string();
    let beyond = |niah: &[(usize, f64)]| -> Option<f64> {
        let v: Vec<f64> = niah.iter().filter(|(l, _)| *l > 512).map(|p| p.1).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let teacher_beyond = r.teacher.as_ref().and_then(|t| t.report.niah.as_ref()).and_then(|g| beyond(&g.by_length()));
    let ungated_beyond: Vec<(String, f64)> = ["linear_attn", "retnet"].iter().filter_map(|m| Some((m.to_string(), beyond(&row(m)?.niah)?))).collect();
    let gdn_beyond = row("gated_deltanet").and_then(|g| beyond(&g.niah));
    out.push(match (teacher_beyond, gdn_beyond, ungated_beyond.is_empty()) {
        (Some(t), Some(g), false) if t >= 0.5 => {
            let worst = ungated_beyond.iter().map(|u| u.1).fold(0.0, f64::max);
            let evidence = format!("accuracy beyond 512 tokens: teacher {t:.2}, Gated DeltaNet {g:.2}, {}", ungated_beyond.iter().map(|(m, a)| format!("{m} {a:.2}")).collect::<Vec<_>>().join(", "));
            let status = if worst <= 0.1 && g > worst {
                Status::Reproduced
            } else if g == 0.0 && worst == 0.0 {
                // No student retrieves at all: the contrast the claim draws needs one that does.
                Status::NotYetTestable
            } else {
                Status::NotReproduced
            };
            let evidence = if status == Status::NotYetTestable { format!("{evidence}: no student retrieves a needle beyond 512 tokens at {tokens}") } else { evidence };
            Finding { claim, status, evidence }
        }
        (Some(t), _, _) if t < 0.5 => Finding { claim, status: Status::NotYetTestable, evidence: format!("the teacher itself retrieves {t:.2} of the needles beyond 512 tokens in this grid") },
        _ => Finding { claim, status: Status::NotYetTestable, evidence: "needs a NIAH grid with lengths beyond 512 for the teacher, Gated DeltaNet and Linear Attention or RetNet".into() },
    });

    // 5. Instruction tuning: the spread of the mixers' averages after tuning against before.
    let claim = "Instruction tuning amplifies the differences between mixers".to_string();
    let before: Vec<f64> = r.tuning.iter().filter_map(|t| t.before).collect();
    let after: Vec<f64> = r.tuning.iter().filter_map(|t| t.after).collect();
    out.push(if before.len() >= 2 && after.len() == before.len() {
        let (sb, sa) = (span(&before), span(&after));
        // A span is a difference of two averages; the difference of two spans, of four.
        let se = r.tuning.iter().flat_map(|t| [t.se_before, t.se_after]).flatten().fold(0.0, f64::max) * 2.0;
        let niah = |v: &[(usize, f64)]| if v.is_empty() { "–".to_string() } else { format!("{:.2}", v.iter().map(|p| p.1).sum::<f64>() / v.len() as f64) };
        let evidence = format!(
            "{} mixers at {tokens}, tuned on {} tokens of conversations: the zero-shot averages span {sb:.4} before and {sa:.4} after ({:+.4} ± {se:.4}); NIAH accuracy before → after: {}",
            before.len(),
            budget_label(r.config.distill.sft_tokens),
            sa - sb,
            r.tuning.iter().map(|t| format!("{} {} → {}", t.mixer, niah(&t.niah_before), niah(&t.niah_after))).collect::<Vec<_>>().join(", ")
        );
        let status = judged(sa - sb, se);
        Finding { claim, status, evidence: if status == Status::NotYetTestable { format!("{evidence}; within two standard errors at this budget") } else { evidence } }
    } else {
        Finding { claim, status: Status::NotYetTestable, evidence: "needs at least two mixers tuned after distillation (stages 1,2,3,4 in the study's [distill]) and zero-shot tasks".into() }
    });

    // 6. The probe predicts the ranking.
    let claim = "The stage-1 probe predicts the final ranking".to_string();
    let n = r.hierarchy.iter().filter(|x| x.probe_rank.is_some()).count();
    let spread = span(&r.hierarchy.iter().filter_map(|x| x.average).collect::<Vec<_>>());
    let se = r.hierarchy.iter().filter_map(|x| x.se).fold(0.0, f64::max) * std::f64::consts::SQRT_2;
    let evidence = format!("{n} mixers at {tokens}: Spearman ρ of the probe's ranking against the final {} = {}; the final averages span {spread:.4}", r.score, fmt(r.probe_rho, 2));
    out.push(match r.probe_rho {
        Some(_) if n < 3 => Finding { claim, status: Status::NotYetTestable, evidence: format!("{evidence}; needs at least three mixers") },
        Some(_) if !beyond_noise(spread, se) => Finding { claim, status: Status::NotYetTestable, evidence: format!("{evidence}, within two standard errors (2 × {se:.4}): the final ranking is noise at this budget") },
        Some(rho) => Finding { claim, status: if rho >= 0.5 { Status::Reproduced } else { Status::NotReproduced }, evidence },
        None => Finding { claim, status: Status::NotYetTestable, evidence: format!("{evidence}; needs probe losses and final scores that differ") },
    });

    // 7. Linear attention's deficit is its normalisation.
    let claim = "Linear Attention's deficit comes from its normalisation, not its update rule".to_string();
    let normed: Vec<&Ablation> = r.ablations.iter().filter(|a| a.mixer == "linear_attn" && a.budget == r.budget && matches!(a.arm, Arm::LaDenominator | Arm::LaOutputNorm | Arm::LaNormalized)).collect();
    out.push(match normed.iter().filter(|a| a.delta_average.is_some()).max_by(|a, b| a.delta_average.unwrap_or(0.0).total_cmp(&b.delta_average.unwrap_or(0.0))) {
        Some(a) => {
            let (d, se) = (a.delta_average.unwrap_or(0.0), a.se.unwrap_or(0.0));
            let evidence = format!("best normalised arm {}: zero-shot average {d:+.4} ± {se:.4}, probe {} against the paper's linear attention", a.arm.name(), fmt(a.delta_probe, 4));
            let status = if !beyond_noise(d, se) { Status::NotYetTestable } else if d > 0.0 && a.delta_probe.is_none_or(|p| p < 0.0) { Status::Reproduced } else { Status::NotReproduced };
            Finding { claim, status, evidence }
        }
        None => Finding { claim, status: Status::NotYetTestable, evidence: "needs linear_attn with the arms la-denominator, la-output-norm or la-normalized beside paper".into() },
    });
    out
}

/// Builds the report and writes report.json, figures/ and index.html into `out`; prints the
/// hierarchy (or the report as JSON).
pub fn publish(out: &Path, study: &StudyConfig, json: bool) -> Result<()> {
    let r = build(out, study)?;
    write_json(&out.join("report.json"), &r)?;
    let figures_dir = out.join("figures");
    std::fs::create_dir_all(&figures_dir).map_err(|e| anyhow!("{}: {e}", figures_dir.display()))?;
    let score_of = |p: &Point| if r.score == "recovery" { p.report.recovery } else { p.report.average };
    let mixers: Vec<&str> = {
        let mut m: Vec<&str> = r.jobs.iter().filter(|j| j.arm == r.arm).map(|j| j.mixer.as_str()).collect();
        m.dedup();
        m
    };
    let curves: Vec<(String, Vec<(f64, f64)>)> = mixers
        .iter()
        .map(|m| {
            let mut pts: Vec<(f64, f64)> = r.jobs.iter().filter(|j| j.arm == r.arm && j.mixer == *m).flat_map(|j| j.distilled()).filter_map(|p| Some((p.tokens as f64, score_of(p)?))).collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            (m.to_string(), pts)
        })
        .filter(|c| !c.1.is_empty())
        .collect();
    let probe: Vec<(String, f64, f64)> = r.hierarchy.iter().filter_map(|x| Some((x.mixer.clone(), x.probe?, if r.score == "recovery" { x.recovery? } else { x.average? }))).collect();
    let mut figures = crate::report::study_figures(&figures_dir, &r.score, &curves, &probe, r.probe_rho)?;
    // The students at the end of their runs, and the teacher, through compare's tables and figures.
    let mut models: Vec<ModelReport> = r.teacher.iter().map(|t| t.report.clone()).collect();
    // (A tuned job's distilled end is its snapshot before stage 4: its training curves are the run's.)
    models.extend(r.jobs.iter().filter_map(|j| {
        let p = j.distilled_end()?;
        let curves = p.report.distillation.clone().or_else(|| j.points.last()?.report.distillation.clone());
        Some(ModelReport { label: p.report.label.split('@').next().unwrap_or_default().to_string(), distillation: curves, ..p.report.clone() })
    }));
    let compared = Report { tasks: study.eval.tasks.clone(), limit: study.eval.limit, reference: r.teacher.as_ref().map(|t| t.report.label.clone()), models };
    let more = crate::report::figures(&figures_dir, &compared)?;
    let html = html(&r, &figures, &compared, &more);
    figures.extend(more);
    std::fs::write(out.join("index.html"), html).map_err(|e| anyhow!("{}: {e}", out.join("index.html").display()))?;
    if json {
        outln!("{}", serde_json::to_string(&r)?);
    } else {
        out!("{}", text(&r));
        outln!("report: {}", out.join("index.html").display());
    }
    Ok(())
}

fn text(r: &StudyReport) -> String {
    let mut s = format!("{} at {} tokens, arm {}:\n{:16}{:>10}{:>10}{:>14}{:>8}{:>8}\n", r.score, budget_label(r.budget), r.arm.name(), "mixer", "average", "recovery", "held-out ppl", "probe#", "final#");
    for x in &r.hierarchy {
        let _ = writeln!(s, "{:16}{:>10}{:>10}{:>14.2}{:>8}{:>8}", x.mixer, fmt(x.average, 4), fmt(x.recovery, 3), x.perplexity, fmt(x.probe_rank, 1), fmt(x.final_rank, 1));
    }
    let _ = writeln!(s, "probe against final ranking: Spearman rho {}", fmt(r.probe_rho, 3));
    if !r.tuning.is_empty() {
        let _ = writeln!(s, "instruction tuning, before -> after:");
        for t in &r.tuning {
            let niah = |v: &[(usize, f64)]| v.iter().map(|(l, a)| format!("{l}:{a:.2}")).collect::<Vec<_>>().join(" ");
            let _ = writeln!(s, "  {:16}average {} -> {}  ppl {:.2} -> {:.2}  NIAH {} -> {}", t.mixer, fmt(t.before, 4), fmt(t.after, 4), t.perplexity_before, t.perplexity_after, niah(&t.niah_before), niah(&t.niah_after));
        }
    }
    for f in &r.findings {
        let _ = writeln!(s, "[{}] {}: {}", f.status.text(), f.claim, f.evidence);
    }
    if !r.missing.is_empty() {
        let _ = writeln!(s, "without results yet: {}", r.missing.join(", "));
    }
    s
}

fn html(r: &StudyReport, figures: &[crate::report::Figure], compared: &Report, more: &[crate::report::Figure]) -> String {
    let mut h = crate::report::html_head("What matters in linearizing: the study");
    let c = &r.config;
    let _ = writeln!(
        h,
        "<p>Teacher <code>{}</code>{}; mixers {}; budgets {}; arms {}. The largest budget, {} tokens, is {:.3} % of the paper's {} tokens: every conclusion below is what this budget can show, and a claim marked <i>not yet testable</i> needs more tokens (or the evaluation it names).</p>",
        esc(&c.teacher),
        c.distill.layers.map_or(String::new(), |n| format!(" (its first {n} blocks, as the students)")),
        c.mixers.iter().map(|m| m.name()).collect::<Vec<_>>().join(", "),
        c.budgets.iter().map(|b| budget_label(*b)).collect::<Vec<_>>().join(", "),
        c.arms.iter().map(|a| a.name()).collect::<Vec<_>>().join(", "),
        budget_label(r.budget),
        100.0 * r.budget as f64 / r.paper_tokens as f64,
        budget_label(r.paper_tokens)
    );
    h.push_str("<h2>The paper's findings</h2>\n<table><tr><th>claim</th><th>here</th><th>evidence</th></tr>\n");
    for f in &r.findings {
        let _ = writeln!(h, "<tr><td>{}</td><td><b>{}</b></td><td style=\"text-align:left\">{}</td></tr>", esc(&f.claim), f.status.text(), esc(&f.evidence));
    }
    h.push_str("</table>\n");
    let niah_lengths: Vec<usize> = r.hierarchy.iter().find(|x| !x.niah.is_empty()).map(|x| x.niah.iter().map(|p| p.0).collect()).unwrap_or_default();
    let _ = writeln!(h, "<h2>Hierarchy: arm {}, {} tokens</h2>\n<p>Sorted by {}; ± one standard error of the zero-shot average. Probe: held-out stage-1 loss after stage 1. Ranks: 1 = best. Spearman ρ of the two rankings: <b>{}</b>.</p>", r.arm.name(), budget_label(r.budget), r.score, fmt(r.probe_rho, 3));
    h.push_str("<table><tr><th>mixer</th><th>average</th><th>recovery</th><th>held-out ppl</th>");
    for l in &niah_lengths {
        let _ = write!(h, "<th>NIAH {l}</th>");
    }
    h.push_str("<th>probe</th><th>probe rank</th><th>final rank</th></tr>\n");
    for x in &r.hierarchy {
        let _ = write!(h, "<tr><td>{}</td><td>{} ± {}</td><td>{}</td><td>{:.2}</td>", esc(&x.mixer), fmt(x.average, 4), fmt(x.se, 4), fmt(x.recovery, 3), x.perplexity);
        for (_, a) in &x.niah {
            let _ = write!(h, "<td>{a:.2}</td>");
        }
        let _ = writeln!(h, "<td>{}</td><td>{}</td><td>{}</td></tr>", fmt(x.probe, 5), fmt(x.probe_rank, 1), fmt(x.final_rank, 1));
    }
    h.push_str("</table>\n");
    if !r.ablations.is_empty() {
        h.push_str("<h2>Arms against the paper's recipe</h2>\n<p>Each arm minus the paper's recipe for the same mixer and budget (± one standard error of the difference).</p>\n<table><tr><th>arm</th><th>whose</th><th>mixer</th><th>budget</th><th>Δ average</th><th>Δ held-out ppl</th><th>Δ probe</th></tr>\n");
        for a in &r.ablations {
            let _ = writeln!(h, "<tr><td>{} <small>({})</small></td><td>{:?}</td><td>{}</td><td>{}</td><td>{} ± {}</td><td>{:+.2}</td><td>{}</td></tr>", a.arm.name(), esc(a.arm.what()), a.kind, esc(&a.mixer), budget_label(a.budget), a.delta_average.map_or("–".into(), |d| format!("{d:+.4}")), fmt(a.se, 4), a.delta_perplexity, a.delta_probe.map_or("–".into(), |d| format!("{d:+.5}")));
        }
        h.push_str("</table>\n");
    }
    if !r.tuning.is_empty() {
        let lengths: Vec<usize> = r.tuning.iter().find(|t| !t.niah_before.is_empty()).map(|t| t.niah_before.iter().map(|p| p.0).collect()).unwrap_or_default();
        let _ = writeln!(h, "<h2>Instruction tuning: before and after</h2>\n<p>Each student of the hierarchy as distilled and after {} tokens of ChatML conversations (cross entropy on the assistant's tokens{}). NIAH: accuracy by length, before → after.</p>", budget_label(c.distill.sft_tokens), if c.distill.sft_data.is_some() { ", from the study's JSONL file" } else { "; conversations synthesised from the training text and answered by the teacher" });
        h.push_str("<table><tr><th>mixer</th><th>average before</th><th>average after</th><th>held-out ppl before → after</th>");
        for l in &lengths {
            let _ = write!(h, "<th>NIAH {l}</th>");
        }
        h.push_str("</tr>\n");
        for t in &r.tuning {
            let _ = write!(h, "<tr><td>{}</td><td>{} ± {}</td><td>{} ± {}</td><td>{:.2} → {:.2}</td>", esc(&t.mixer), fmt(t.before, 4), fmt(t.se_before, 4), fmt(t.after, 4), fmt(t.se_after, 4), t.perplexity_before, t.perplexity_after);
            for (b, a) in t.niah_before.iter().zip(&t.niah_after) {
                let _ = write!(h, "<td>{:.2} → {:.2}</td>", b.1, a.1);
            }
            h.push_str("</tr>\n");
        }
        h.push_str("</table>\n");
    }
    h.push_str("<h2>Scores against tokens</h2>\n");
    for f in figures {
        h.push_str(&crate::report::figure_html(f));
    }
    if !r.missing.is_empty() {
        let _ = writeln!(h, "<p>Jobs without results yet: {}.</p>", esc(&r.missing.join(", ")));
    }
    h.push_str("<h2>Every student at the end of its run</h2>\n");
    h.push_str(&crate::report::html_sections(compared, more));
    h.push_str("<p>The same numbers: <a href=\"report.json\">report.json</a>; each job's in jobs/&lt;id&gt;/.</p>\n</body></html>\n");
    h
}
